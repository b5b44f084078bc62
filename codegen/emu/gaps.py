"""Where the emulator departs from AMD's ISA documents, and how we make it follow them."""
from __future__ import annotations

import contextlib


def install(emu) -> None:
    pass


@contextlib.contextmanager
def float_mode(kernel):
    yield


@contextlib.contextmanager
def fp8_format(arch):
    yield
