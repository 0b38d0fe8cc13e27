"""The accelerator layer's error, apart from the modules that raise it (no import circles)."""


class AcceleratorError(RuntimeError):
    """The requested accelerator is not usable on this machine."""
