from os import PathLike
from typing import Any, Optional, Union

__version__: str

class RalpcError(Exception):
    """An error from ralpc. ``str(e)`` is the message; ``e.causes`` the messages of its
    causes, outermost first (each also chained as ``__cause__``); ``e.exit_code`` the exit
    status the ``ralpc`` command would return (1 bad input, 2 bad options, 3 cannot write,
    4 internal)."""

    causes: list[str]
    exit_code: int

def plan(
    model: Union[str, PathLike[str]],
    gpus: Optional[int] = None,
    nodes: Optional[int] = None,
    cluster: Optional[str] = None,
    batch: Optional[int] = None,
    **options: Any,
) -> dict[str, Any]:
    """Plans ``model`` (an ONNX file, a PipeDream graph or a DeepPool profile).

    ``options`` are ``ralpc plan``'s options with underscores: ``strategy="dp"``,
    ``microbatches=4``, ``schedule="gpipe"``, ``tolerance=float("inf")``,
    ``tensor_parallel=2``, ``pipeline_parallel=2``, ``zero=3``, ``recompute="full"``,
    ``sequence_parallel=False``, ``memory_limit="16GiB"``, ``inputs={"idx": [8, 2048]}``,
    ``strategy_file="theirs.json"``…; ``True`` passes a flag.

    Returns the summary ``ralpc plan --json`` prints, plus ``placement`` (a
    ``ralpc-strategy/1`` object: stages, and per layer its split, ``module`` and ``kind``),
    ``None`` with ``not_lowered`` saying why when a transformer plan has no per-layer form.

    Raises ``RalpcError``.
    """

def compile(
    model: Union[str, PathLike[str]],
    out: Optional[Union[str, PathLike[str]]] = None,
    gpus: Optional[int] = None,
    nodes: Optional[int] = None,
    cluster: Optional[str] = None,
    batch: Optional[int] = None,
    **options: Any,
) -> dict[str, Any]:
    """Plans ``model`` like :func:`plan` and writes every artifact into ``out``
    (default ``<model stem>.ralpc``): ``plan.json``, ``plan.dot``, ``timeline.json``,
    ``report.html`` and, with Graphviz, ``plan.svg``; ``emit=["torch", "megatron"]`` also
    writes ``train_torch.py`` (a script applying the plan to your model class under
    torchrun) and ``megatron.args`` (Megatron-LM's arguments of a transformer plan). Returns what :func:`plan` returns plus
    ``out`` (the directory) and ``files`` (the names written).

    Raises ``RalpcError``.
    """
