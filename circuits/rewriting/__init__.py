"""The rewriting layer: finding nodes and rewriting circuits, generic over any naming convention.

``matching`` (``Matcher``, ``IterativeMatcher``, fancy validation, the no-match suggestions),
``rewrite`` (``update``, ``replace``, ``substitute``), ``batching`` (``expand``), ``operations``
(rust_circuit's ``Getter``, ``Updater``, ``Expander``) and ``passes`` (the generic rewrite
passes).  The transformer layer teaches the matcher's messages its naming convention through
``hints``, a registry it fills when imported.
"""
