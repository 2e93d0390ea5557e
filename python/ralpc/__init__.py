"""ralpc: plan how every layer of an ONNX model is spread over GPUs, from Python.

``ralpc.plan(model, gpus=8)`` returns the plan as a dict (the fields of ``ralpc plan
--json`` plus ``placement``: every layer's split, stage and PyTorch module);
``ralpc.compile(model, out=..., gpus=8)`` also writes the artifacts (``plan.json``,
``report.html``, …). Both run the Rust library in-process. ``ralpc.torch.parallelize``
applies a plan to the ``nn.Module`` the model was exported from.
"""

from ._ralpc import RalpcError, __version__, compile, plan

__all__ = ["RalpcError", "__version__", "compile", "plan"]
