"""FP8 kernel generator: spec -> Jinja templates -> HIP / CUDA -> ninja -> dispatch.

`import codegen` is cheap: it imports neither torch nor a compiler and builds nothing.
The ops (codegen.ops) build or load their kernels on first call.
"""
__version__ = "0.1.0"


def __getattr__(name):
    if name == "ops":
        import importlib

        return importlib.import_module(".ops", __name__)
    raise AttributeError(name)
