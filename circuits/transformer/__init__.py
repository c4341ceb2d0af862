"""The transformer layer: what the generic layers below know nothing of.

``names`` (the naming convention every model builder follows, and the
activation kinds), ``masks`` (the attention-mask nodes), ``attention`` (the
attention passes: ``causal_mask``, ``split_heads``, ``layer_of``),
``points`` (``Point(kind, layer, head)``: one spot in a model, a matcher
and a cache key) and ``layer_hints`` (where a node sits, for the matcher's
messages).  Importing this package registers those hints, and ``Point`` as
a matcher form, with the matcher (``circuits.rewriting.hints``);
``import circuits`` imports it.
"""

from circuits.rewriting import hints
from circuits.transformer.layer_hints import placement, split_heads_hint
from circuits.transformer.points import Point

hints.register(placer=placement, no_match=split_heads_hint, matcher_form=(Point, Point.matcher))
