"""Byte counts as people read them: the one wording the analyses' messages and the rendering share."""

__all__ = ["fmt_bytes", "fmt_limit"]


def fmt_bytes(n: int) -> str:
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return "%s%.1f %s" % (sign, n / scale, unit)
    return "%s%d B" % (sign, n)


def fmt_limit(n: int) -> str:
    """A cap, as torch's error message gives it ("4.00 GiB allowed")."""
    return "%.2f GiB" % (n / (1 << 30)) if n >= 1 << 30 else fmt_bytes(n)
