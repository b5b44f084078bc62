"""Build machinery: ninja text, compile, cache, publish."""
from .jit import CompileError, cache_key, compile_variant, module_path  # noqa: F401
