"""Which implementation a kernel call runs, and the kernels decorated for it.

CUDA tensors run the compiled Triton kernels; CPU tensors run the same kernels through the
Triton interpreter when the environment variable ``TRITON_INTERPRET=1`` is set (read at call
time, so tests may set it in-process); otherwise CPU tensors use each family's plain torch
path. The interpreter is slow: it is for tests, not for CPU training.
"""

import os

import torch
import triton
import triton.language as tl


def backend_for(t: torch.Tensor) -> str:
    """Which implementation a call on tensor ``t`` uses: ``"triton"``, ``"interpret"`` or
    ``"torch"``. ``TRITON_INTERPRET=1`` is read at call time."""
    if t.is_cuda:
        return "triton"
    if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "interpret"
    return "torch"


#: the decorated kernels by (raw function name, backend), filled on first use
KERNELS: dict[tuple[str, str], object] = {}


class _Interpreted:
    """An interpreted kernel that also works when triton was imported without
    ``TRITON_INTERPRET=1``: triton's own jitted helpers (``tl.max``, ``tl.sum``,
    ``tl.zeros``) were then built as compiled-only functions, so they are swapped for
    interpreted twins during the launch and restored after (not thread-safe)."""

    _HELPERS = ("max", "sum", "zeros")

    def __init__(self, fn):
        from triton.runtime.interpreter import InterpretedFunction

        self._fn = InterpretedFunction(fn)
        self._twins = {}
        for name in self._HELPERS:
            member = getattr(tl, name)
            if not isinstance(member, InterpretedFunction) and hasattr(member, "fn"):
                self._twins[name] = (member, InterpretedFunction(member.fn))

    def __getitem__(self, grid):
        launch = self._fn[grid]

        def run(*args, **kwargs):
            for name, (_, twin) in self._twins.items():
                setattr(tl, name, twin)
            try:
                return launch(*args, **kwargs)
            finally:
                for name, (orig, _) in self._twins.items():
                    setattr(tl, name, orig)

        return run


def kernel(fn, backend: str):
    """The jitted (compiled) or interpreted version of the raw kernel function ``fn``.

    Kernels are plain functions decorated on first use, so one process can run the compiled
    kernel on CUDA tensors and the interpreter on CPU tensors.
    """
    key = (fn.__name__, backend)
    k = KERNELS.get(key)
    if k is None:
        if backend == "interpret":
            k = _Interpreted(fn)
        else:
            k = triton.jit(fn)
        KERNELS[key] = k
    return k
