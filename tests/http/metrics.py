"""The Prometheus text format of /metrics, for the tests in this folder (the
rest of their plumbing is tests/support/harness.py)."""


def parse_metrics(text):
    """Prometheus text format -> {name{labels}: value}, {name: type}."""
    values, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values, types
