"""A stand-in for Hugging Face's `spaces` package (tests only, CPU): the same names the app uses (GPU, aoti_capture,
aoti_compile, aoti_apply, zero.torch.aoti.ZeroGPUCompiledModel/ZeroGPUWeights), which run on the CPU and record every
call, with the GPU seconds each one asked for, as JSON lines in $SPACES_STANDIN_LOG."""
import contextlib
import functools
import inspect
import json
import os
import time

from .zero.torch.aoti import ZeroGPUCompiledModel, ZeroGPUWeights

__all__ = ["GPU", "aoti_capture", "aoti_compile", "aoti_apply", "ZeroGPUCompiledModel", "ZeroGPUWeights"]


def record(event: str, **details) -> None:
    with open(os.environ["SPACES_STANDIN_LOG"], "a") as log:
        log.write(json.dumps({"event": event, "time": time.time(), **details}, default=str) + "\n")


def GPU(fn=None, duration=60):
    """spaces.GPU: each call asks for `duration` seconds (a number, or a function of the call's arguments)."""
    def decorate(function):
        def seconds(args, kwargs):
            return duration(*args, **kwargs) if callable(duration) else duration

        if inspect.isgeneratorfunction(function):
            @functools.wraps(function)
            def generator(*args, **kwargs):
                record("gpu call", function=function.__name__, duration=seconds(args, kwargs))
                yield from function(*args, **kwargs)
                record("gpu call end", function=function.__name__)
            return generator

        @functools.wraps(function)
        def call(*args, **kwargs):
            record("gpu call", function=function.__name__, duration=seconds(args, kwargs))
            try:
                return function(*args, **kwargs)
            finally:
                record("gpu call end", function=function.__name__)
        return call
    return decorate if fn is None else decorate(fn)


class _Captured(Exception):
    """Stops the captured run at the module's first call."""


class _Call:
    args: tuple = ()
    kwargs: dict = {}


@contextlib.contextmanager
def aoti_capture(module):
    """Records the arguments of the module's first call and stops the code under the `with` there."""
    call, original = _Call(), module.forward

    def capture(*args, **kwargs):
        call.args, call.kwargs = args, kwargs
        raise _Captured

    module.forward = capture
    try:
        yield call
    except _Captured:
        pass
    finally:
        module.forward = original
    record("aoti_capture", module=type(module).__name__, kwargs=sorted(call.kwargs))


def aoti_compile(exported, inductor_configs=None):
    """The exported program itself as the "archive" (no AoTInductor on this machine), with its weights."""
    record("aoti_compile", inductor_configs=inductor_configs)
    return ZeroGPUCompiledModel(exported, ZeroGPUWeights(dict(exported.state_dict)))


def aoti_apply(compiled, module):
    """The module's forward becomes the compiled program; its parameters are drained, as ZeroGPU does: from now on
    only the compiled program's weights are used."""
    record("aoti_apply", module=type(module).__name__)
    module.forward = compiled
    for parameter in module.parameters():
        parameter.data = parameter.data.new_empty(0)
