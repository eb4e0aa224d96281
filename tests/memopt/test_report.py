"""memopt.report: the text and JSON forms of what memory_optimize did."""
import json

from memopt.graph import Size
from memopt.report import Bytes, Holder, Report, Reuse, format_bytes, format_size


def sample() -> Report:
    return Report(
        program_type="legacy", level=1, skip_grads=False, gc=False,
        runtime="garbage collection off (FLAGS_eager_delete_tensor_gb=-1)",
        reuses=[
            Reuse("relu_0.tmp_0", "fc_0.tmp_1", "fc_0.tmp_1", (-1, 128), "float32",
                  Size(512, 1), how="in-place", op="relu"),
            Reuse("fc_1.b_0@GRAD", "relu_0.tmp_0", "fc_0.tmp_1", (128,), "float32",
                  Size(512, 0), block=2),
        ],
        temporaries_before=Bytes.total([Size(512, 1), Size(512, 1), Size(512, 0)]),
        temporaries_after=Bytes.total([Size(512, 1)]),
        batch_size=32, persistable_bytes=4096, peak_before=40960, peak_after=20480,
        top_holders=[Holder("fc_0.tmp_1", 16384, ("fc_0.tmp_1", "relu_0.tmp_0")),
                     Holder("x", 8192, ("x",))],
        release="by the garbage collector", not_merged={"persistable": 4, "skip_opt_set": 1},
        seconds=0.0123, notes=["moved 2 optimizer ops"])


def test_human_and_sizes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 2 ** 30) == "3.0 GiB"
    assert format_size(Size(512, 1)) == "512 B*B"
    assert format_size(Size(2048, 2)) == "2.0 KiB*B^2"
    assert format_size(4096) == "4.0 KiB"
    total = Bytes.total([Size(512, 1), 100, Size(1024, 1)])
    assert total.terms == ((0, 100), (1, 1536))
    assert total.at(2) == 100 + 3072
    assert str(total) == "100 B + 1.5 KiB*B"
    assert str(Bytes()) == "0 B"


def test_text():
    report = sample()
    text = str(report)
    lines = text.splitlines()
    assert lines[0].startswith("memopt: ")          # the summary first
    assert report.reuses[0].line() == ("relu_0.tmp_0 [-1, 128] float32 512 B*B -> fc_0.tmp_1 "
                                       "(in-place at relu)")
    assert report.reuses[1].line() == ("fc_1.b_0@GRAD (block 2) [128] float32 512 B -> "
                                       "relu_0.tmp_0 (rename, now 'fc_0.tmp_1')")
    # then one line per memory shared, the larger first
    assert lines[-2:] == ["    fc_0.tmp_1 512 B*B <- relu_0.tmp_0 (in-place at relu)",
                          "    fc_0.tmp_1 (block 2) 512 B <- fc_1.b_0@GRAD (rename)"]
    assert "merged variables: 2 (1 in place)" in text
    # one peak figure, at the stated batch; the sum of sizes says it is no peak
    assert "sizes of all temporaries added up (not a peak): 512 B + 1.0 KiB*B -> 512 B*B" in text
    assert "peak of the step at batch 32: 40.0 KiB -> 20.0 KiB" in text
    assert sum("peak" in line and "->" in line and "not a peak" not in line
               for line in lines) == 1
    assert "fc_0.tmp_1: 16.0 KiB (shared by 2)" in text
    assert "left alone: persistable: 4, skip_opt_set: 1" in text
    assert "note: moved 2 optimizer ops" in text
    assert report.merged_count == 2


def test_json_round_trip():
    data = json.loads(sample().to_json())
    assert data["merged_count"] == 2
    assert data["reuses"][0]["size"] == {"coefficient": 512, "power": 1}
    assert data["reuses"][1]["shape"] == [128]
    assert data["temporaries_before"] == {"B^0": 512, "B^1": 1024}
    assert data["top_holders"][0] == {"name": "fc_0.tmp_1", "bytes": 16384,
                                      "members": ["fc_0.tmp_1", "relu_0.tmp_0"]}
    assert data["gc"] is False and data["level"] == 1
    assert json.loads(Report().to_json())["merged_count"] == 0
