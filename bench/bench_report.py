"""One result table for the Python benchmarks: each figure beside the
reference measured in the same run, as a ratio, with an optional target."""


class Report:
    """report(name, value_s, ref_name, ref_s, target=None) prints one line
    and records it; .results (for --json) and .missed (targets missed)."""

    def __init__(self, name_width=20, ref_width=24):
        self.results = []
        self.missed = []
        self._nw = name_width
        self._rw = ref_width

    def __call__(self, name, value, ref_name, ref, target=None):
        ratio = value / ref
        ok = target is None or ratio <= target
        self.results.append({"workload": name, "value_s": value, "reference": ref_name,
                             "reference_s": ref, "ratio": ratio,
                             "target": None if target is None else f"<= {target}", "met": ok})
        tgt = "" if target is None else f" (target <= {target}) {'ok' if ok else 'MISSED'}"
        print(f"{name:<{self._nw}} {value:8.3f} s | {ref_name:<{self._rw}} {ref:8.3f} s | "
              f"ratio {ratio:6.3f}{tgt}", flush=True)
        if not ok:
            self.missed.append(name)
