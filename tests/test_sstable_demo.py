"""engine/demo.py runs end to end and reports what it measured."""

from engine import demo


def test_demo_writes_reopens_reads_and_reports(tmp_path, capsys):
    demo.main(["--dir", str(tmp_path), "--keys", "3000", "--lookups", "2000"])
    out = capsys.readouterr().out
    assert "filter bytes mapped 0, resident 0" in out  # reopening maps nothing
    assert "3,000/3,000 present keys found with the right value" in out
    assert " 0 wrongly found" in out
    rows = [line for line in out.splitlines() if line.startswith("00000")]
    assert len(rows) == 3 and all("BloomFilter.v1" in r for r in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000001.sst", "000002.sst",
                                                          "000003.sst"]
