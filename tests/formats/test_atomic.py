"""The temporary-name convention: one writer (``temp_name``) and one parser (``parse_temp_name``)."""

import os
import subprocess
import sys

import pytest

from colitools.formats.atomic import parse_temp_name, temp_name, write_bytes_atomic
from colitools.formats.filenames import MANIFEST_FILE, USAGE_FILE


@pytest.mark.parametrize(
    ("final", "temp"),
    [
        ("model-00001-of-00002.safetensors", ".model-00001-of-00002.safetensors.tmp-4242"),
        (MANIFEST_FILE, ".colitools.json.tmp-4242"),
        (USAGE_FILE, ".coli_usage.tmp-4242"),  # hidden already: no second dot
        (".colibri-mirror.json", ".colibri-mirror.json.tmp-4242"),
        ("a.tmp-7", ".a.tmp-7.tmp-4242"),
    ],
)
def test_temp_name_round_trips_through_the_parser(tmp_path, final, temp):
    path = temp_name(tmp_path / final, pid=4242)
    assert path == tmp_path / temp
    parsed = parse_temp_name(path.name)
    assert parsed is not None and parsed.pid == 4242
    assert parsed.is_temp_of(final)
    assert not parsed.is_temp_of(final + "x")


def test_temp_name_defaults_to_this_process():
    assert parse_temp_name(temp_name("x/config.json").name).pid == os.getpid()


def test_parser_accepts_the_earlier_double_dot_form_of_a_dotfile():
    parsed = parse_temp_name("..coli_usage.tmp-17")
    assert parsed is not None and parsed.pid == 17
    assert parsed.is_temp_of(".coli_usage")


@pytest.mark.parametrize(
    "name",
    ["config.json", ".coli_usage", "x.tmp-12", ".x.tmp-", ".x.tmp-12a", ".x.tmp12", ".tmp-12", "..tmp-x"],
)
def test_parser_refuses_names_the_writer_never_produces(name):
    assert parse_temp_name(name) is None


def test_temporary_left_by_a_killed_process_names_it_and_its_file(tmp_path):
    # a real process dies after creating its temporary and before the rename
    code = (
        "import os, signal, sys\n"
        "from colitools.formats.atomic import temp_name\n"
        "t = temp_name(sys.argv[1])\n"
        "open(t, 'wb').write(b'half')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path / USAGE_FILE)])
    assert child.returncode == -9
    (left,) = os.listdir(tmp_path)
    parsed = parse_temp_name(left)
    assert parsed is not None and parsed.is_temp_of(USAGE_FILE) and parsed.pid != os.getpid()
    # this process publishes the file under its own temporary, leaving the dead one's alone
    write_bytes_atomic(tmp_path / USAGE_FILE, b"whole")
    assert sorted(os.listdir(tmp_path)) == sorted([left, USAGE_FILE])
    assert (tmp_path / USAGE_FILE).read_bytes() == b"whole"
