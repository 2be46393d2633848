"""Checks ckptd's reader (through interop_tool, and ckptctl when built)
against a checkpoint written by stock torch.distributed.checkpoint.save and
its expected.json (stock_spec.expected_record). Needs no torch: used by
tests/python/test_torch2_fixtures.py on committed fixtures (Debian torch
1.13 or no torch at all) and by tests/interop on freshly saved ones.
"""
import json
import pathlib

import interop_common as ic
from sample_spec import strict_equal
from stock_spec import FIXTURE_FORMAT, TS, decode_value, expected_chunks, sha256


def load_expected(fixture_dir):
    exp = json.loads((pathlib.Path(fixture_dir) / "expected.json").read_text())
    if exp.get("format") != FIXTURE_FORMAT:
        raise AssertionError(f"{fixture_dir}: expected.json format {exp.get('format')!r}, "
                             f"this checker reads {FIXTURE_FORMAT!r}")
    return exp


def _box_set(chunks):
    return sorted((tuple(o), tuple(s)) for o, s in chunks)


def check_fixture(fixture_dir, check_ckptctl=True):
    """Raises AssertionError listing every mismatch."""
    d = pathlib.Path(fixture_dir)
    exp = load_expected(d)
    problems = []
    if not (d / ".metadata").is_file():
        raise AssertionError(f"{d}: no .metadata")

    items = ic.list_items(d)
    want = {r["fqn"] for r in exp["tensors"]} | {r["fqn"] for r in exp["objects"]}
    if set(items) != want:
        problems.append(f"fqns: ckptd lists {sorted(set(items) - want)} extra, "
                        f"{sorted(want - set(items))} missing")

    reads = []  # the tensors whose listing agrees: their bytes are read below
    for rec in exp["tensors"]:
        fqn = rec["fqn"]
        it = items.get(fqn)
        if it is None:
            continue
        if it["kind"] != "tensor":
            problems.append(f"{fqn}: ckptd says {it['kind']}, expected tensor")
            continue
        if it["dtype"] != rec["dtype"] or it["shape"] != rec["shape"]:
            problems.append(f"{fqn}: ckptd says {it['dtype']}{it['shape']}, "
                            f"expected {rec['dtype']}{rec['shape']}")
            continue
        if it["path"] != rec["path"]:
            problems.append(f"{fqn}: planner_data path {it['path']} != {rec['path']}")
        listed = [(c["offsets"], c["sizes"]) for c in it["chunks"]]
        if "saved_chunks" in rec and _box_set(listed) != _box_set(rec["saved_chunks"]):
            problems.append(f"{fqn}: chunks {_box_set(listed)} != torch's {_box_set(rec['saved_chunks'])}")
        if "dist" in rec:
            ts = TS.from_json(rec)
            ts.dist = (rec["dist"]["mesh"], [tuple(p) for p in rec["dist"]["placements"]])
            nonempty = [(o, s) for o, s in listed if all(x > 0 for x in s)]
            if _box_set(nonempty) != [(tuple(o), tuple(s)) for o, s in expected_chunks(ts, exp["world"])]:
                problems.append(f"{fqn}: non-empty chunks {_box_set(nonempty)} != DTensor layout "
                                f"{expected_chunks(ts, exp['world'])}")
        # The record itself agrees with the formula (no torch needed).
        formula = sha256(TS.from_json(rec).box_bytes())
        if formula != rec["sha256"]:
            problems.append(f"{fqn}: expected.json sha256 disagrees with the formula "
                            f"(fixture generator bug)")
        reads.append(rec)

    # Every full and resharded box in one interop_tool process; where that
    # fails, box by box, to name each box that fails.
    boxes = [(rec["fqn"], [0] * len(rec["shape"]), rec["shape"], rec["nbytes"], rec["sha256"], "full")
             for rec in reads]
    boxes += [(rec["fqn"], box["offsets"], box["sizes"], None, box["sha256"],
               f"box {box['offsets']}+{box['sizes']}")
              for rec in reads for box in rec.get("boxes", [])]
    try:
        got_all = ic.read_boxes(d, [b[:3] for b in boxes])
    except AssertionError:
        got_all = None
    for k, (fqn, offsets, sizes, nbytes, digest, what) in enumerate(boxes):
        if got_all is not None:
            got = got_all[k]
        else:
            try:
                got = ic.read_box(d, fqn, offsets, sizes)
            except AssertionError as e:
                problems.append(f"{fqn} {what}: read failed: {e}")
                continue
        if (nbytes is not None and len(got) != nbytes) or sha256(got) != digest:
            problems.append(f"{fqn} {what}: read differs ({len(got)} bytes)")

    for rec in exp["objects"]:
        fqn = rec["fqn"]
        it = items.get(fqn)
        if it is None:
            continue
        if it["kind"] != "bytes":
            problems.append(f"{fqn}: ckptd says {it['kind']}, expected bytes")
            continue
        if it["path"] != rec["path"]:
            problems.append(f"{fqn}: planner_data path {it['path']} != {rec['path']}")
        want_value = decode_value(rec["value"])
        try:
            got, text = ic.read_object(d, fqn)
        except Exception as e:  # tool failure or a Repr literal_eval cannot parse
            problems.append(f"{fqn}: read-object failed: {e}")
            continue
        diff = strict_equal(got, want_value, fqn)
        if diff:
            problems.append(f"{fqn}: ckptd read {text}, expected {rec['repr']} ({diff})")

    if check_ckptctl and ic.have_ckptctl():
        proc = ic.ckptctl("verify", d, check=False)
        if proc.returncode != 0:
            problems.append(f"ckptctl verify exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")

    if problems:
        raise AssertionError(f"{d}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
