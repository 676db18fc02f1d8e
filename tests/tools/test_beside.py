"""tests/gpu/beside.sh, the side-by-side measurement on a card, run here over stand-ins
for its programs: the commands it gives each, the table it makes of the two benches'
outputs, and the refusals of what it cannot run."""
import json
import os
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "gpu", "beside.sh")

# A bench's table as each program prints it (bloomery-bench's, then llama-bench's).
BLOOMERY = """bloomery-bench: plan: stage 0: layers 0..3 on CUDA0
| model | size | params | backend | threads | test | t/s |
| --- | ---: | ---: | --- | ---: | ---: | ---: |
| deepseek2 4.54B Q4_K - Medium | 2.78 GiB | 4.54 B | CUDA | 16 | pp512 | 35835.37 ± 134.02 |
| deepseek2 4.54B Q4_K - Medium | 2.78 GiB | 4.54 B | CUDA | 16 | tg32 @ d4096 | 539.16 ± 0.69 |
| deepseek2 4.54B Q4_K - Medium | 2.78 GiB | 4.54 B | CUDA | 16 | tg32 | 575.93 ± 3.59 |
"""
LLAMA = """| model                          |       size | backend    | ngl |  fa |            test |                  t/s |
| ------------------------------ | ---------: | ---------- | --: | --: | --------------: | -------------------: |
| deepseek2 ?B Q4_K - Medium     |   2.78 GiB | CUDA       |  99 |   1 |           pp512 |   22490.56 ± 1868.99 |
| deepseek2 ?B Q4_K - Medium     |   2.78 GiB | CUDA       |  99 |   1 |    tg32 @ d4096 |       549.01 ± 6.67 |

build: d32676d77 (1)
"""


def program(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def stand_ins(tmp_path, bench_rc=0):
    """A build folder and a peer folder whose programs log their arguments and print
    the tables above; the model maker writes an empty file."""
    log = tmp_path / "calls"
    build, peer = tmp_path / "build", tmp_path / "peer"
    (build / "bin").mkdir(parents=True)
    peer.mkdir()
    program(build / "bin" / "bloomery-mkmodel",
            '#!/bin/bash\necho "mkmodel $*" >> %s\n'
            'while [ $# -gt 0 ]; do [ "$1" = -o ] && { : > "$2"; shift; }; shift; done\n' % log)
    program(build / "bin" / "bloomery-bench",
            "#!/bin/bash\necho \"bench $*\" >> %s\ncat <<'EOF'\n%sEOF\nexit %d\n" % (log, BLOOMERY, bench_rc))
    program(peer / "llama-bench", "#!/bin/bash\necho \"llama $*\" >> %s\ncat <<'EOF'\n%sEOF\n" % (log, LLAMA))
    return build, peer, log


def beside(*args):
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_the_two_benches_side_by_side_with_their_ratio(tmp_path):
    build, peer, log = stand_ins(tmp_path)
    r = beside("--build", str(build), "--peer", str(peer), "--threads", "3", "--tests", "-p 512 -n 32 -d 0,4096",
               "deepseek-v3-4")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| deepseek-v3-4 | bloomery | llama.cpp | ratio |"
    assert "| pp512 | 35835.37 | 22490.56 | 1.59 |" in rows
    assert "| tg32 @ d4096 | 539.16 | 549.01 | 0.98 |" in rows
    assert "| tg32 | 575.93 | - | - |" in rows  # a test only one bench printed
    calls = log.read_text().splitlines()
    assert calls[0].startswith("mkmodel -o /dev/shm/beside-deepseek-v3-4.gguf --preset deepseek-v3 --layers 4 ")
    assert "--bench-fill --threads 3" in calls[0]
    assert calls[1] == "bench -m /dev/shm/beside-deepseek-v3-4.gguf -ngl 99 -p 512 -n 32 -d 0,4096 --no-roofline -t 3"
    assert calls[2] == "llama -m /dev/shm/beside-deepseek-v3-4.gguf -ngl 99 -fa 1 -p 512 -n 32 -d 0,4096"
    assert not os.path.exists("/dev/shm/beside-deepseek-v3-4.gguf")  # removed after its shape


def test_cpu_moe_puts_every_routed_expert_in_host_ram_in_both(tmp_path):
    build, peer, log = stand_ins(tmp_path)
    r = beside("--build", str(build), "--peer", str(peer), "--threads", "16", "--cpu-moe", "gpt-oss-120b")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| gpt-oss-120b, routed experts in host RAM | bloomery | llama.cpp | ratio |" in r.stdout
    calls = log.read_text().splitlines()
    assert calls[1] == ("bench -m /dev/shm/beside-gpt-oss-120b.gguf -ngl 99 -cmoe --no-residency -p 512 -n 128 -r 2"
                        " --no-roofline -t 16")
    assert calls[2] == "llama -m /dev/shm/beside-gpt-oss-120b.gguf -ngl 99 -ncmoe 999 -t 16 -fa 1 -p 512 -n 128 -r 2"


def test_layers_and_dir_cut_the_file_and_place_it(tmp_path):
    """--layers N cuts each shape (its own --layers, if any, comes first and gives way),
    --dir puts the file there; the table's title says the cut."""
    build, peer, log = stand_ins(tmp_path)
    files = tmp_path / "files"
    files.mkdir()
    r = beside("--build", str(build), "--peer", str(peer), "--threads", "4", "--cpu-moe", "--layers", "18",
               "--dir", str(files), "gpt-oss-120b", "deepseek-v3-4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| gpt-oss-120b (18 layers), routed experts in host RAM | bloomery | llama.cpp | ratio |" in r.stdout
    calls = log.read_text().splitlines()
    f = str(files / "beside-gpt-oss-120b.gguf")
    assert calls[0] == "mkmodel -o %s --preset gpt-oss-120b --layers 18 --bench-fill --threads 4" % f
    assert calls[1].startswith("bench -m %s -ngl 99 -cmoe" % f)
    assert calls[3] == ("mkmodel -o %s --preset deepseek-v3 --layers 4 --experts 16 --layers 18 --bench-fill "
                        "--threads 4" % (files / "beside-deepseek-v3-4.gguf"))
    assert not list(files.iterdir())  # each file removed after its shape


def test_vary_runs_the_bench_once_a_value_beside_one_llama_run(tmp_path):
    build, peer, log = stand_ins(tmp_path)
    # the stand-in bench logs the knob's value it was given
    program(build / "bin" / "bloomery-bench",
            "#!/bin/bash\necho \"bench GG=${BLOOMERY_CUDA_GG_ROWS:-unset} $*\" >> %s\ncat <<'EOF'\n%sEOF\n"
            % (log, BLOOMERY))
    r = beside("--build", str(build), "--peer", str(peer), "--threads", "4", "--tests", "-p 512 -n 0",
               "--vary", "BLOOMERY_CUDA_GG_ROWS=64,16,0", "gpt-oss-120b")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    bench = "-m /dev/shm/beside-gpt-oss-120b.gguf -ngl 99 -p 512 -n 0 --no-roofline -t 4"
    assert calls[1:] == ["bench GG=64 " + bench, "bench GG=16 " + bench, "bench GG=0 " + bench,
                         "llama -m /dev/shm/beside-gpt-oss-120b.gguf -ngl 99 -fa 1 -p 512 -n 0"]
    for v in ("64", "16", "0"):
        assert "| gpt-oss-120b, BLOOMERY_CUDA_GG_ROWS=%s | bloomery | llama.cpp | ratio |" % v in r.stdout
    assert r.stdout.count("| pp512 | 35835.37 | 22490.56 | 1.59 |") == 3


def test_programs_in_meson_folders_are_found(tmp_path):
    build, peer, log = stand_ins(tmp_path)
    (build / "tools").mkdir()
    for name in ("bloomery-mkmodel", "bloomery-bench"):
        os.rename(build / "bin" / name, build / "tools" / name)
    r = beside("--build", str(build), "--peer", str(peer), "deepseek-v3-4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "+ %s/tools/bloomery-bench -m" % build in r.stdout
    assert len(log.read_text().splitlines()) == 3


def test_a_failing_bench_fails_the_run(tmp_path):
    build, peer, _ = stand_ins(tmp_path, bench_rc=3)
    r = beside("--build", str(build), "--peer", str(peer), "gpt-oss-120b")
    assert r.returncode == 1
    assert "exit 3" in r.stdout


def test_dry_run_prints_every_command_and_runs_none(tmp_path):
    build, peer, log = stand_ins(tmp_path)
    r = beside("--dry-run", "--build", str(build), "--peer", str(peer), "--serve", "1,8", "--tokenizer", "/tok",
               "qwen3-30b-a3b")
    assert r.returncode == 0, r.stderr
    assert not log.exists()
    text = r.stdout + r.stderr
    assert "--ctx 40960 --tokenizer /tok --bench-fill" in text
    assert "bloomery-serve -m /dev/shm/beside-qwen3-30b-a3b.gguf -ngl 99 -np 8 -c 16384 --port 8180" in text
    assert "llama-server -m /dev/shm/beside-qwen3-30b-a3b.gguf -ngl 99 -fa on -np 8 -c 16384 --port 8181" in text
    assert "bloomery-load --url http://127.0.0.1:8181 -c 8 -d 20 -n 128 --ignore-eos --mode native" in text


def test_what_it_cannot_run_is_refused(tmp_path):
    for args, says in ((["--peer", "/p", "llama-3"], "unknown shape llama-3"),
                       (["deepseek-v3-4"], "give --peer DIR"),
                       (["--peer", "/p"], "at least one shape"),
                       (["--peer", "/p", "--serve", "8x", "glm-4.5-air"], "--serve takes stream counts"),
                       (["--peer", "/p", "--threads", "many", "glm-4.5-air"], "--threads takes a number"),
                       (["--peer", "/p", "--bogus", "glm-4.5-air"], "unknown option --bogus"),
                       (["--peer", "/p", "--vary", "GG_ROWS", "glm-4.5-air"], "--vary takes VAR=V1,V2"),
                       (["--peer", "/p", "--vary", "1X=2", "glm-4.5-air"], "--vary takes VAR=V1,V2"),
                       (["--peer", "/p", "--vary", "X=", "glm-4.5-air"], "--vary X: no values"),
                       (["--peer", "/p", "--vary", "X=1,,2", "glm-4.5-air"], "the value '' is empty"),
                       (["--peer", "/p", "--vary", "X=1;rm", "glm-4.5-air"], "not a plain word"),
                       (["--peer", "/p", "--layers", "0", "glm-4.5-air"], "--layers takes a number"),
                       (["--peer", "/p", "--layers", "2x", "glm-4.5-air"], "--layers takes a number"),
                       (["--peer", "/p", "--dir", "/nowhere/at/all", "glm-4.5-air"], "not a folder")):
        r = beside(*args)
        assert r.returncode == 2, args
        assert says in r.stderr, (args, r.stderr)


def bans(tmp_path, tokenizer):
    path = tmp_path / "tokenizer.json"
    path.write_text(tokenizer if isinstance(tokenizer, str) else json.dumps(tokenizer), encoding="utf-8")
    return subprocess.run(["python3", os.path.join(ROOT, "tests", "tools", "bpe_bans.py"), str(path)],
                          capture_output=True, text=True, timeout=60)


def test_the_servers_bans_are_the_pieces_that_are_not_whole_utf8(tmp_path):
    # "\u0120hi" is " hi"; "\u00c3" alone is the lead byte 0xc3 of a two-byte character,
    # "\u00c3\u00a9" the whole of "é"; "\u00e2\u0122" two bytes of a three-byte one
    vocab = {"\u0120hi": 0, "\u00c3": 1, "\u00c3\u00a9": 2, "\u00e2\u0122": 3, "x": 4, "\u4e00": 5}
    r = bans(tmp_path, {"model": {"vocab": vocab}, "added_tokens": [{"id": 6, "content": "<|im_end|>"}]})
    assert r.returncode == 0, r.stderr
    # 5: a code point outside the byte alphabet is no piece of this vocabulary
    assert json.loads(r.stdout) == {"logit_bias": [[1, False], [3, False], [5, False], [6, False]]}


def test_a_tokenizer_file_it_cannot_read_is_refused_by_name(tmp_path):
    for text in ("{", '{"model": {}}', "[]"):
        r = bans(tmp_path, text)
        assert r.returncode == 1 and "tokenizer.json" in r.stderr and r.stdout == "", (text, r.stderr)
