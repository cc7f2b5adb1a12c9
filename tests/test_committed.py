"""reports/ is the current result set and its index says so: every file there is listed in
reports/README.md, every listed file is there, and the whole stays small enough to travel with the tree."""

from __future__ import annotations

from committed import INDEX, ROOT, listed

LIMIT_BYTES = 20 << 20


def test_every_committed_file_is_listed_and_every_listed_file_is_committed():
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "reports").rglob("*") if p.is_file() and p != INDEX}
    named = set(listed())
    assert sorted(on_disk - named) == [], "files in reports/ that reports/README.md does not list"
    assert sorted(named - on_disk) == [], "files reports/README.md lists that are not in reports/"


def test_the_result_set_stays_under_its_size_limit():
    total = sum(p.stat().st_size for p in (ROOT / "reports").rglob("*") if p.is_file())
    assert total < LIMIT_BYTES, f"reports/ holds {total / 2**20:.1f} MiB, over {LIMIT_BYTES >> 20} MiB"


def test_every_profile_document_names_a_hardware_profile_that_loads_again_and_fits_its_gpu():
    # `taxes report --hardware NAME` of a document re-attributes it with the profile it names
    from taxes.documents import results
    from taxes.model.hardware import get_profile, gpu_kind

    for path in sorted((ROOT / "reports" / "profile").glob("*.json.gz")):
        meta = results.load(path)["metadata"]
        hw = get_profile(meta["hardware_profile"])
        kinds = {gpu_kind(g) for g in meta.get("gpu_names") or []}
        assert kinds == {hw.name.split("-")[0]}, (path.name, meta["hardware_profile"], kinds)  # an H100's, an H100
