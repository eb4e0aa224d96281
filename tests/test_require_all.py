"""The MEMOPT_REQUIRE_ALL switch turns a would-be skip into a failure."""
import subprocess
import sys
import textwrap


def _run_pytest(tmp_path, require_all: str):
    test = tmp_path / "test_missing.py"
    test.write_text(textwrap.dedent("""
        from conftest import need

        def test_needs_missing_package():
            need("memopt_no_such_package_xyz")
    """))
    (tmp_path / "conftest.py").write_text(
        (__import__("pathlib").Path(__file__).parent / "conftest.py").read_text())
    env = dict(__import__("os").environ, MEMOPT_REQUIRE_ALL=require_all)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(test)], cwd=tmp_path, env=env,
                          capture_output=True, text=True)


def test_missing_package_skips_without_require_all(tmp_path):
    result = _run_pytest(tmp_path, "0")
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout


def test_missing_package_fails_with_require_all(tmp_path):
    result = _run_pytest(tmp_path, "1")
    assert result.returncode == 1, result.stdout
    assert "MEMOPT_REQUIRE_ALL=1" in result.stdout
