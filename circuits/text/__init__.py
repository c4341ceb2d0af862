"""The text layer: circuits as FORMAT.md text (docs/format.md), and files of it.

``printing`` (the writer: ``repr_many``), ``parsing`` (the reader: ``parse``, ``parse_many``),
``html`` (collapsible HTML for notebooks), ``diff`` (what a rewrite changed, side by side),
``store`` (safetensors files named by content hash) and ``saving`` (``save``/``load``: the text in
a file, the tensors in a store beside it).
"""
