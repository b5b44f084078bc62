"""FP8 kernel generator: spec -> Jinja templates -> HIP / CUDA -> ninja -> dispatch.

`import codegen` is cheap: it imports neither torch nor a compiler and builds nothing.
The ops (codegen.ops), the modules (codegen.nn) and the vLLM- and AITER-named entry points
(codegen.vllm, codegen.aiter) build or load their kernels on first call;
codegen.supported(device) says what runs where.
"""
__version__ = "0.1.0"


def __getattr__(name):
    import importlib

    if name in ("ops", "nn", "vllm", "aiter"):
        return importlib.import_module(f".{name}", __name__)
    if name == "supported":
        return importlib.import_module(".support", __name__).supported
    raise AttributeError(name)
