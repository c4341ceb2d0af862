"""The transformer layer: what the generic layers below know nothing of.

``names`` (the naming convention every model builder follows, and the
activation kinds), ``masks`` (the attention-mask nodes), ``attention`` (the
attention passes: ``causal_mask``, ``split_heads``, ``layer_of``),
``points`` (``point(kind, layer, head)``: the matcher for one layer's
activation) and ``layer_hints`` (where a node sits, for the matcher's
messages).  Importing this package registers those hints with the matcher
(``circuits.rewriting.hints``); ``import circuits`` imports it.
"""

from circuits.rewriting import hints
from circuits.transformer.layer_hints import placement, split_heads_hint

hints.register(placer=placement, no_match=split_heads_hint)
