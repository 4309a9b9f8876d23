"""The domain-free actor kernel on Trio (never imports ``harness``)."""

__all__: list[str] = []
