"""The core layer: the node classes and what they are made of.

``nodes`` (the node classes, ``check_node``), ``shapes`` (shape rules: einsum axes, broadcasting,
index normalization), ``functions`` (GeneralFunction specs and their registry), ``aten_functions``
(the specs of the aten ops an import keeps), ``hashing`` (content hashes of tensors and node
structure), ``traversal`` (iterative walks over a circuit DAG) and ``gcpause`` (the cyclic garbage
collector paused around bulk node creation).  Nothing here knows a higher layer, except
``Circuit``'s convenience methods (docs/architecture.md).
"""
