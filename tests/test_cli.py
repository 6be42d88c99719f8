import subprocess
import sys

from regional.store import EpochKind, EpochRecord, FallBack, RegionState, Slice, Standing, Store


def test_status_command_prints_regions_and_epochs(tmp_path):
    store = Store(tmp_path)
    store.write_record(EpochRecord(0, EpochKind.GLOBAL, {"a/b": Slice(0, 5, 5), "c": Slice(0, 5, 5)}, {},
                                   {"a/b": RegionState(5, 0), "c": RegionState(5, 0)}))
    store.write_record(EpochRecord(
        1, EpochKind.REGIONAL, {"a/b": Slice(5, 9, 4)}, {"c": FallBack(0, "ConnectionError: down")},
        {"a/b": RegionState(9, 1), "c": RegionState(5, 0, 1, Standing.FALLEN_BACK, "ConnectionError: down")},
        regional_epochs=1))
    out = subprocess.run([sys.executable, "-m", "regional", "status", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "2 regions, 2 epochs recorded, 1 regional, oldest ref_epoch 0" in out
    assert any(line.split()[:5] == ["c", "5", "0", "1", "fallen_back"] for line in out.splitlines())
    assert "epoch 1: regional; committed 1 [a/b]; fallen back 1 [c(ref_epoch=0)]" in out


def test_status_command_on_a_corrupt_store_says_so_and_fails(tmp_path):
    (tmp_path / "regional" / "epochs").mkdir(parents=True)
    (tmp_path / "regional" / "epochs" / "000000000000.json").write_text("regional epoch v1 sha256=00\n{not json")
    result = subprocess.run([sys.executable, "-m", "regional", "status", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "corrupt" in result.stderr
