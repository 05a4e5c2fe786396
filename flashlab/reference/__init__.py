"""The course's reference code: attention as the notebooks derive it, in plain PyTorch, and the
float64 ground truth every kernel is checked against.

- `checks`: the input rules every entry point applies (shapes, dtypes, masks, windows), each
  error naming the argument and the fix.
- `naive`: attention from two einsums and a softmax, masks and windows (notebook 01).
- `float64`: the float64 reference, its gradients, and the error norms and tolerances the tests use.
- `online_softmax`: the streaming softmax state and its merge (notebook 03).
- `tiled`: the tiled forward and the recomputing backward in PyTorch (notebooks 03 and 04).
- `first_order`: first derivatives only; a second derivative raises instead of being dropped.

The bottom layer: imports nothing else of flashlab (tests/course/test_import_graph.py).
"""
