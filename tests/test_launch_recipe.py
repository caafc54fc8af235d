"""Recipe and clusters files: the seed parses as is, and every fault is reported at its FILE:LINE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swaplab.errors import ConfigError, SwaplabError
from swaplab.launch.cluster import get_cluster, load_clusters
from swaplab.launch.recipe import load_recipe, normalize_argument
from swaplab.launch.tomlfile import key_lines

FIXTURES = Path(__file__).parent / "fixtures" / "launch"
SEED = FIXTURES / "glm53-flash-exl3" / "recipe.toml"
SEED_ORIGINAL = Path("/work/shared/seeds/001_eaf0e3957f35727e.txt")


def write(tmp_path: Path, text: str, name: str = "recipe.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def faults_of(load, path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(path)
    return [str(fault) for fault in caught.value.faults]


def line_of(path: Path, needle: str, occurrence: int = 1) -> int:
    """The 1-based line of the `occurrence`-th line containing `needle`."""
    found = [number for number, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    return found[occurrence - 1]


# --- the seed --------------------------------------------------------------------------------


@pytest.mark.skipif(not SEED_ORIGINAL.exists(), reason="the shared seed is not on this machine")
def test_the_fixture_is_the_seed_minus_its_path_line():
    assert SEED.read_text() == SEED_ORIGINAL.read_text().split("\n", 1)[1]


def test_the_seed_parses_as_is():
    recipe = load_recipe(SEED)
    assert recipe.engine == "vllm"
    assert recipe.name == "GLM-5.3-Flash EXL3-4bpw + DFlash2 (Entrpi image, 2x Spark, TP=2)"
    assert recipe.docker_image == "glm53-flash-exl3:local"
    assert recipe.docker_image_dir == SEED.parent.absolute() / "glm53-flash-exl3"
    assert recipe.model == "brandonmusic/GLM-5.3-Flash-tr3-4bpw"
    assert (recipe.required_nodes, recipe.tensor_parallel_size, recipe.pipeline_parallel_size) == (2, 2, 1)
    assert recipe.distributed_backend == "mp"
    assert recipe.shm_size == "32gb"
    assert recipe.entrypoint == ("vllm", "serve")
    assert recipe.replace_image_entrypoint is False
    assert recipe.port == 30000
    assert recipe.env["HF_HUB_OFFLINE"] == "1" and recipe.offline
    assert len(recipe.env) == 8
    assert [(mount.host, mount.container, mount.env) for mount in recipe.extra_mounts] == [
        ("/mnt/nas/ai/huggingface", "/mnt/nas/ai/huggingface", "HF_HOME"),
        ("~/.cache/glm53-exl3-jit/triton", "/root/.triton", None),
        ("~/.cache/glm53-exl3-jit/flashinfer", "/root/.cache/flashinfer", None),
        ("~/.cache/glm53-exl3-jit/vllm", "/root/.cache/vllm", None),
    ]
    assert recipe.slug == "glm53-flash-exl3"
    assert recipe.drop_caches is True


def test_the_seeds_quoted_json_arguments_arrive_as_one_json_argument_each():
    args = load_recipe(SEED).args
    speculative = args[args.index("--speculative-config") + 1]
    assert speculative == '{"method":"dflash","model":"incoai/GLM-5.3-Flash-DFlash2","num_speculative_tokens":7}'
    assert json.loads(speculative)["num_speculative_tokens"] == 7
    template = args[args.index("--default-chat-template-kwargs") + 1]
    assert json.loads(template) == {"enable_thinking": False}
    # Every other argument comes through exactly as written: no shell quotes, no newlines.
    assert len(args) == 35
    assert not any("\n" in argument or argument.startswith("'") for argument in args)


def test_the_readiness_of_vllm_has_the_seeds_boot_markers_and_fatal_errors():
    readiness = load_recipe(SEED).readiness
    assert "Application startup complete" in readiness.ready
    assert "EngineDeadError" in readiness.fatal and "OutOfMemoryError" in readiness.fatal
    assert readiness.path == "/health"
    assert readiness.timeout == 3600


def test_a_recipe_folder_stands_for_its_recipe_toml():
    assert load_recipe(SEED.parent).path == SEED.absolute()


def test_the_digest_ignores_comments_but_not_values(tmp_path):
    base = 'engine = "process"\nargs = ["true"]\n'
    first = load_recipe(write(tmp_path, base, "a.toml")).digest()
    assert load_recipe(write(tmp_path, "# a comment\n" + base, "b.toml")).digest() == first
    assert load_recipe(write(tmp_path, base.replace("true", "false"), "c.toml")).digest() != first


@pytest.mark.parametrize(
    ("written", "received"),
    [
        ("'{\"a\": 1}'", '{"a": 1}'),
        ("\n'{\"a\": [1, 2]}'\n", '{"a": [1, 2]}'),
        ("  '[1, 2]'  ", "[1, 2]"),
        ('{"a": 1}\n', '{"a": 1}'),
        ("'not json'", "'not json'"),
        ("'{not json}'", "'{not json}'"),
        ("plain", "plain"),
        (" spaced ", " spaced "),
        ("'{\"a\": 1}", "'{\"a\": 1}"),
    ],
)
def test_json_unwrapping_rule(written, received):
    assert normalize_argument(written) == received


def test_the_readiness_section_adds_to_the_engine_defaults(tmp_path):
    recipe = load_recipe(write(tmp_path, """\
engine = "vllm"
docker_image = "vllm/vllm-openai:v0.11.0"
model = "Qwen/Qwen3-0.6B"
[readiness]
path = "/v1/models"
ready = ["Uvicorn running"]
fatal = "Traceback"
timeout = 90
"""))
    assert recipe.readiness.ready == ("Application startup complete", "Uvicorn running")
    assert recipe.readiness.fatal[0] == "EngineDeadError" and recipe.readiness.fatal[-1] == "Traceback"
    assert (recipe.readiness.path, recipe.readiness.timeout) == ("/v1/models", 90.0)


# --- recipe faults ---------------------------------------------------------------------------


def test_every_fault_of_a_recipe_comes_in_one_pass_at_its_line(tmp_path):
    path = write(tmp_path, """\
engine = "vllm"
docker_image = "img:1"
model = "org/model"
tensor_parallel_size = "2"
colour = "blue"
args = [
    "--served-model-name", "m",
    "--nnodes", "2",
    true,
]
port = 70000

[env]
GOOD = "1"
FLAG = false

[[extra_mounts]]
host = "relative/path"
container = "/data"

[[extra_mounts]]
host = "/ok"
container = "/ok"
surprise = 1

[readiness]
ready = ["(unclosed"]
""")
    assert faults_of(load_recipe, path) == [
        f"{path}:4: tensor_parallel_size must be a whole number, not a string '2'",
        f"{path}:5: unknown key 'colour'; known keys: " + "engine, name, docker_image, docker_image_dir, model, extra_models, required_nodes, tensor_parallel_size, pipeline_parallel_size, data_parallel_size, gpus_per_node, distributed_backend, shm_size, entrypoint, replace_image_entrypoint, args, port, rendezvous_port, drop_caches, env, extra_mounts, readiness, container, pre_serve",
        f"{path}:6: args must be an array of strings, not an array [{', '.join(repr(x) for x in ['--served-model-name', 'm', '--nnodes', '2', True])}]: element 4 is a boolean; write it as a string",
        f"{path}:11: port must be a port number, not an integer 70000: a port is 1 to 65535",
        f"{path}:15: env.FLAG must be a string, not a boolean; quote it",
        f"{path}:18: extra_mounts[0].host must be an absolute path or one starting with ~/, not a string 'relative/path': relative paths would depend on where ssh lands",
        f"{path}:24: unknown key 'surprise' in extra_mounts[1]; known keys: host, container, env",
        f"{path}:27: readiness.ready must be an array of regular expressions, not an array ['(unclosed']: '(unclosed' is not a regular expression (missing ), unterminated subpattern at position 0)",
    ]


def test_launcher_owned_flags_in_args_are_faults_at_their_element_line(tmp_path):
    path = write(tmp_path, """\
engine = "vllm"
docker_image = "img:1"
model = "org/model"
tensor_parallel_size = 2
required_nodes = 2
args = [
    "--tensor-parallel-size", "2",
    "--port=8000",
    "--master-addr", "10.0.0.1",
    "--model", "other/model",
]
""")
    assert faults_of(load_recipe, path) == [
        f"{path}:8: args set --port to 8000, but port is 30000 and the launcher passes that: set port = 8000 and drop the flag",
        f"{path}:9: remove --master-addr from args: the launcher sets it for each rank",
        f"{path}:10: remove --model from args: `model` is passed as vllm serve's first argument",
    ]


@pytest.mark.parametrize("written", ['"--tensor-parallel-size=4"', '"--tensor-parallel-size", "4"', '"-tp", "4"', '"-tp=4"'])
def test_a_tensor_parallel_flag_against_the_key_names_both_values_once(tmp_path, written):
    # It used to read `args set --tensor-parallel-size=4 4 but ...`: the value twice, the key's never.
    flag = written.split(",")[0].strip('"').partition("=")[0]
    path = write(tmp_path, f"""\
engine = "vllm"
docker_image = "img:1"
model = "org/model"
tensor_parallel_size = 2
required_nodes = 2
args = [{written}]
""")
    assert faults_of(load_recipe, path) == [
        (f"{path}:6: args set {flag} to 4, but tensor_parallel_size is 2 and the launcher passes that: "
        "set tensor_parallel_size = 4 and drop the flag"),
    ]


def test_a_recipe_key_flag_without_a_value_is_a_fault_too(tmp_path):
    path = write(tmp_path, 'engine = "sglang"\ndocker_image = "img:1"\nmodel = "org/model"\nargs = ["--tp-size", "--trust-remote-code"]\n')
    assert faults_of(load_recipe, path) == [
        f"{path}:4: args give --tp-size without a value; the launcher passes tensor_parallel_size (1): drop the flag",
    ]


def test_the_seeds_backend_flag_must_agree_with_distributed_backend(tmp_path):
    text = SEED.read_text().replace('distributed_backend = "mp"', 'distributed_backend = "ray"')
    path = write(tmp_path, text)
    assert faults_of(load_recipe, path) == [
        (f"{path}:{line_of(path, '--distributed-executor-backend')}: args set --distributed-executor-backend to mp, "
        'but distributed_backend is "ray" and the launcher passes that: set distributed_backend = "mp" and drop the flag')
    ]


# --- the parallel layout against the gang's GPUs ------------------------------------------------

ONE_GPU_NOTE = " (a node counts as 1 GPU; set gpus_per_node for nodes with more)"


def layout_recipe(tmp_path: Path, engine: str, keys: str, args: str = "") -> Path:
    """A recipe whose layout keys start on line 4."""
    return write(tmp_path, f'engine = "{engine}"\ndocker_image = "img:1"\nmodel = "org/model"\n{keys}\nargs = [{args}]\n')


@pytest.mark.parametrize(
    ("engine", "keys", "args"),
    [
        ("vllm", "required_nodes = 2\ntensor_parallel_size = 2", ""),
        ("vllm", "required_nodes = 2\npipeline_parallel_size = 2", ""),
        ("vllm", "required_nodes = 2\ndata_parallel_size = 2", ""),
        ("vllm", "required_nodes = 2\ntensor_parallel_size = 2\ndistributed_backend = \"ray\"", ""),
        ("vllm", "tensor_parallel_size = 8\ngpus_per_node = 8", ""),
        ("vllm", "required_nodes = 2\ngpus_per_node = 4\ntensor_parallel_size = 4\npipeline_parallel_size = 2", ""),
        ("vllm", "required_nodes = 4\ntensor_parallel_size = 2\ndata_parallel_size = 2", ""),
        ("sglang", "required_nodes = 2\ntensor_parallel_size = 2", ""),
        ("sglang", "required_nodes = 2\ndata_parallel_size = 2", ""),
        # DP attention splits the TP GPUs among DP groups: TP alone counts.
        ("sglang", "required_nodes = 2\ntensor_parallel_size = 2\ndata_parallel_size = 2", '"--enable-dp-attention"'),
        ("vllm", "", ""),
    ],
)
def test_layouts_that_fill_the_gangs_gpus_are_accepted(tmp_path, engine, keys, args):
    load_recipe(layout_recipe(tmp_path, engine, keys, args))


@pytest.mark.parametrize(
    ("engine", "keys", "args", "line", "message"),
    [
        ("vllm", "tensor_parallel_size = 1\nrequired_nodes = 2", "", 4,
         "tensor_parallel_size 1 x pipeline_parallel_size 1 x data_parallel_size 1 = 1 GPU, but 2 nodes x 1 GPU each = 2: "
         "every GPU of the gang runs one rank, so make the sizes' product 2 or set required_nodes = 1" + ONE_GPU_NOTE),
        # Only required_nodes written: the fault is at its line.
        ("vllm", "required_nodes = 2", "", 4,
         "tensor_parallel_size 1 x pipeline_parallel_size 1 x data_parallel_size 1 = 1 GPU, but 2 nodes x 1 GPU each = 2: "
         "every GPU of the gang runs one rank, so make the sizes' product 2 or set required_nodes = 1" + ONE_GPU_NOTE),
        ("vllm", "required_nodes = 1\ntensor_parallel_size = 8", "", 5,
         "tensor_parallel_size 8 x pipeline_parallel_size 1 x data_parallel_size 1 = 8 GPUs, but 1 node x 1 GPU each = 1: "
         "every GPU of the gang runs one rank, so make the sizes' product 1 or set required_nodes = 8" + ONE_GPU_NOTE),
        ("vllm", "required_nodes = 2\ntensor_parallel_size = 2\ndata_parallel_size = 2", "", 5,
         "tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 2 = 4 GPUs, but 2 nodes x 1 GPU each = 2: "
         "every GPU of the gang runs one rank, so make the sizes' product 2 or set required_nodes = 4" + ONE_GPU_NOTE),
        ("vllm", "required_nodes = 2\ngpus_per_node = 8\ntensor_parallel_size = 4", "", 6,
         ("tensor_parallel_size 4 x pipeline_parallel_size 1 x data_parallel_size 1 = 4 GPUs, but 2 nodes x 8 GPUs each = 16: "
         "every GPU of the gang runs one rank, so make the sizes' product 16")),
        ("sglang", "required_nodes = 2\ntensor_parallel_size = 2\ndata_parallel_size = 2", "", 5,
         "tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 2 = 4 GPUs, but 2 nodes x 1 GPU each = 2: "
         "every GPU of the gang runs one rank, so make the sizes' product 2 or set required_nodes = 4" + ONE_GPU_NOTE),
        ("sglang", "required_nodes = 2\ndata_parallel_size = 4", '"--enable-dp-attention"', 4,
         "tensor_parallel_size 1 x pipeline_parallel_size 1 = 1 GPU, but 2 nodes x 1 GPU each = 2: "
         "every GPU of the gang runs one rank, so make the sizes' product 2 or set required_nodes = 1" + ONE_GPU_NOTE),
    ],
)
def test_layouts_that_do_not_fill_the_gangs_gpus_are_refused_with_the_arithmetic(tmp_path, engine, keys, args, line, message):
    path = layout_recipe(tmp_path, engine, keys, args)
    assert faults_of(load_recipe, path) == [f"{path}:{line}: {message}"]


def test_a_size_that_does_not_read_is_one_fault_not_two(tmp_path):
    path = layout_recipe(tmp_path, "vllm", 'required_nodes = 2\ntensor_parallel_size = "2"\ngpus_per_node = 0')
    assert faults_of(load_recipe, path) == [
        f"{path}:5: tensor_parallel_size must be a whole number, not a string '2'",
        f"{path}:6: gpus_per_node must be a whole number of GPUs, not an integer 0: it must be at least 1",
    ]


@pytest.mark.parametrize(
    ("engine", "written"),
    [("vllm", '"--data-parallel-size", "2"'), ("vllm", '"-dp=2"'), ("sglang", '"--dp", "2"'), ("sglang", '"--data-parallel-size=2"')],
)
def test_data_parallel_flags_in_args_are_read_against_the_key(tmp_path, engine, written):
    # DP in args would escape the layout check: it is the key's, like TP and PP.
    path = layout_recipe(tmp_path, engine, "required_nodes = 2\ntensor_parallel_size = 2", written)
    flag = written.split(",")[0].strip('"').partition("=")[0]
    assert faults_of(load_recipe, path) == [
        (f"{path}:6: args set {flag} to 2, but data_parallel_size is 1 and the launcher passes that: "
        "set data_parallel_size = 2 and drop the flag"),
    ]


def test_layout_keys_mean_nothing_to_llamacpp_and_process_is_not_checked(tmp_path):
    path = write(tmp_path, 'engine = "llamacpp"\ndocker_image = "x"\nmodel = "/m.gguf"\ndata_parallel_size = 2\ngpus_per_node = 2\n')
    assert faults_of(load_recipe, path) == [
        f"{path}:4: data_parallel_size means nothing to llama.cpp, which splits layers across its RPC workers; remove it",
        f"{path}:5: gpus_per_node means nothing to llama.cpp, which splits layers across its RPC workers; remove it",
    ]
    # llama.cpp's ranks are its nodes, each offering the GPUs it has: no layout to check.
    assert load_recipe(write(tmp_path, 'engine = "llamacpp"\ndocker_image = "x"\nmodel = "/m.gguf"\nrequired_nodes = 3\n', "l3.toml"))
    # A process is one per node whatever it runs.
    assert load_recipe(write(tmp_path, 'engine = "process"\nrequired_nodes = 2\nargs = ["true"]\n', "p.toml"))


def test_missing_required_keys_and_engine_mismatches(tmp_path):
    path = write(tmp_path, 'name = "nothing"\n')
    assert faults_of(load_recipe, path) == [
        f"{path}:1: missing required key 'engine' (one of vllm, sglang, llamacpp, process) in the top level",
    ]
    path = write(tmp_path, 'engine = "sglang"\ndistributed_backend = "ray"\n', "sglang.toml")
    assert faults_of(load_recipe, path) == [
        f"{path}:1: missing required key 'docker_image' (an image reference such as \"vllm/vllm-openai:v0.11.0\") in the top level",
        f"{path}:1: missing required key 'model' (a Hugging Face repo id or a path) in the top level",
        f'{path}:2: distributed_backend = "ray" is vLLM\'s; sglang brings its own',
    ]
    path = write(tmp_path, 'engine = "process"\ndocker_image = "x"\n', "process.toml")
    assert faults_of(load_recipe, path) == [
        f"{path}:1: engine = \"process\" runs args: give the command as args = [\"program\", ...]",
        f'{path}:2: docker_image means nothing to engine = "process" (it runs args directly, no container); remove it',
    ]
    path = write(tmp_path, 'engine = "llamacpp"\ndocker_image = "x"\nmodel = "/m.gguf"\ntensor_parallel_size = 2\n', "l.toml")
    assert faults_of(load_recipe, path) == [
        f"{path}:4: tensor_parallel_size means nothing to llama.cpp, which splits layers across its RPC workers; remove it",
    ]


def test_replace_image_entrypoint_defaults_by_engine_and_is_a_container_key(tmp_path):
    # vLLM and SGLang images (NGC's wrapper) run the command after the image; llama.cpp's
    # images have a server binary as their entrypoint, so it is replaced unless the recipe says.
    common = 'docker_image = "img:1"\nmodel = "/m.gguf"\n'
    for engine, default in (("vllm", False), ("sglang", False), ("llamacpp", True)):
        assert load_recipe(write(tmp_path, f'engine = "{engine}"\n{common}', f"{engine}.toml")).replace_image_entrypoint is default
        flipped = f'engine = "{engine}"\n{common}replace_image_entrypoint = {str(not default).lower()}\n'
        assert load_recipe(write(tmp_path, flipped, f"{engine}-flipped.toml")).replace_image_entrypoint is not default
    path = write(tmp_path, f'engine = "vllm"\n{common}replace_image_entrypoint = "yes"\n', "bad.toml")
    assert faults_of(load_recipe, path) == [
        f"{path}:4: replace_image_entrypoint must be true or false, not a string 'yes'",
    ]
    path = write(tmp_path, 'engine = "process"\nargs = ["true"]\nreplace_image_entrypoint = true\n', "process.toml")
    assert faults_of(load_recipe, path) == [
        f'{path}:3: replace_image_entrypoint means nothing to engine = "process" (it runs args directly, no container); remove it',
    ]


def test_a_syntax_error_is_a_fault_at_its_line(tmp_path):
    path = write(tmp_path, 'engine = "vllm"\nargs = [\n  "a",\n  "b" "c",\n]\n')
    (fault,) = faults_of(load_recipe, path)
    assert fault.startswith(f"{path}:4: not valid TOML")


def test_a_missing_recipe_is_a_fault(tmp_path):
    assert faults_of(load_recipe, tmp_path / "absent.toml") == [f"{tmp_path / 'absent.toml'}:1: no such file"]


def test_mount_env_and_env_table_may_not_both_set_a_variable(tmp_path):
    path = write(tmp_path, """\
engine = "vllm"
docker_image = "img:1"
model = "org/model"
[env]
HF_HOME = "/x"
[[extra_mounts]]
host = "/hub"
container = "/hub"
env = "HF_HOME"
""")
    assert faults_of(load_recipe, path) == [f"{path}:9: HF_HOME is set by this mount and by [env] too; keep one"]


# --- where each key is -----------------------------------------------------------------------


def test_key_lines_follow_tables_arrays_and_strings_that_look_like_toml():
    text = '''\
top = 1
text = """
[not.a.table]
fake = "key"
"""
literal = \'\'\'
[[nor.this]]\'\'\'
"quoted.key" = "a # not a comment"
args = [
  "first", # comment with ] and }
  # a line comment [x]
  """
second""",
  { inline = 1, nested = { deep = true } },
]
dotted.sub.key = 3

[table]
inside = 'x'
[[items]]
name = "a"
[items.detail]
colour = "red"
[[items]]
name = "b"
hosts = [{ name = "h1", fabric_ip = "10.0.0.1" },
         { name = "h2", fabric_ip = "10.0.0.2" }]
'''
    lines = key_lines(text)
    assert lines[("top",)] == 1
    assert lines[("text",)] == 2
    assert ("not", "a", "table") not in lines and ("fake",) not in lines
    assert lines[("literal",)] == 6 and ("nor",) not in lines
    assert lines[("quoted.key",)] == 8
    assert lines[("args", 0)] == 10
    assert lines[("args", 1)] == 12
    assert lines[("args", 2)] == 14
    assert lines[("args", 2, "nested", "deep")] == 14
    assert lines[("dotted", "sub", "key")] == 16
    assert lines[("table",)] == 18 and lines[("table", "inside")] == 19
    assert lines[("items", 0, "name")] == 21
    assert lines[("items", 0, "detail", "colour")] == 23
    assert lines[("items", 1, "name")] == 25
    assert lines[("items", 1, "hosts", 1, "fabric_ip")] == 27


def test_key_lines_of_the_seed_point_at_the_speculative_config_string():
    lines = key_lines(SEED.read_text())
    args = load_recipe(SEED).args
    index = args.index("--speculative-config") + 1
    assert lines[("args", index)] == line_of(SEED, '"--speculative-config", """')
    assert lines[("extra_mounts", 3, "container")] == line_of(SEED, 'container = "/root/.cache/vllm"')
    assert lines[("env", "VLLM_NO_USAGE_STATS")] == line_of(SEED, "VLLM_NO_USAGE_STATS")


# --- clusters --------------------------------------------------------------------------------


def test_the_clusters_fixture_loads():
    clusters = load_clusters(FIXTURES / "clusters.toml")
    ds4 = clusters["ds4"]
    assert [(host.name, host.fabric_ip) for host in ds4.hosts] == [("dgx3", "192.168.100.3"), ("dgx4", "192.168.100.4")]
    assert ds4.user == "giovanni" and ds4.hf_cache_dir == "/mnt/nas/ai/huggingface"
    assert ds4.nccl["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert ds4.local_cache_dir is None
    assert clusters["ds4-local"].local_cache_dir == "~/.cache/huggingface"


def test_a_loopback_cluster_with_ssh_ports_and_options_loads(tmp_path):
    path = write(tmp_path, """\
[clusters.loop]
ssh_options = ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null"]
hosts = [{ name = "127.0.0.1", fabric_ip = "127.0.0.1", ssh_port = 2222 },
         { name = "127.0.0.2", fabric_ip = "127.0.0.2", ssh_port = 2222 }]
""", "clusters.toml")
    cluster = get_cluster(path, "loop")
    assert cluster.ssh_options == ("StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null")
    assert [host.ssh_port for host in cluster.hosts] == [2222, 2222]
    assert all(host.is_loopback for host in cluster.hosts)
    assert cluster.nccl == {} and cluster.user is None


def test_every_fault_of_a_clusters_file_in_one_pass(tmp_path):
    path = write(tmp_path, """\
[clusters.a]
user = 7
hosts = [{ name = "n1", fabric_ip = "dgx3" },
         { name = "n2" },
         { name = "n3", fabric_ip = "10.0.0.3", port = 22 }]
[clusters.b]
hf_cache_dir = "relative"
[nccl.a]
NCCL_DEBUG = "INFO"
"1BAD" = "x"
[nccl.c]
X = "y"
""", "clusters.toml")
    assert faults_of(load_clusters, path) == [
        f"{path}:2: clusters.a.user must be a string, not an integer 7",
        (f"{path}:3: clusters.a.hosts[0].fabric_ip must be the IP address the ranks meet on, "
        "not a string 'dgx3': write the node's fabric IP address itself, not a name"),
        f"{path}:4: missing required key 'fabric_ip' (the IP address the ranks meet on) in [clusters.a.hosts[1]]",
        f"{path}:5: unknown key 'port' in clusters.a.hosts[2]; known keys: name, fabric_ip, ssh_port",
        f"{path}:6: missing required key 'hosts' in [clusters.b]: a list of {{ name, fabric_ip }}, head first",
        (f"{path}:7: clusters.b.hf_cache_dir must be an absolute path or one starting with ~/, not a string 'relative': "
        "relative paths would depend on where ssh lands"),
        f"{path}:10: '1BAD' is not an environment variable name (letters, digits, _)",
        f"{path}:11: [nccl.c] names no cluster; known clusters: a, b",
    ]


def test_an_unknown_cluster_or_a_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(SwaplabError, match=r"no cluster 'ds9' in .*; known clusters: ds4, ds4-local, ds4-own-disks, ds4-privileged"):
        get_cluster(FIXTURES / "clusters.toml", "ds9")
    with pytest.raises(SwaplabError, match=r"no clusters file at .*absent.toml; write one with a \[clusters.ds4\] table"):
        get_cluster(tmp_path / "absent.toml", "ds4")


# --- secrets by reference: ${env.NAME} in [env] ---------------------------------------------

SECRET_RECIPE = """\
engine = "process"
args = ["true"]

[env]
PLAIN = "stays as written"
HF_TOKEN = "${env.SWAPLAB_TEST_TOKEN}"
AUTHORIZATION = "Bearer ${env.SWAPLAB_TEST_TOKEN} for ${env.SWAPLAB_TEST_USER}"
"""


def test_env_references_are_read_with_their_lines_and_kept_as_written(tmp_path):
    path = write(tmp_path, SECRET_RECIPE)
    recipe = load_recipe(path)
    # The recipe holds the reference, never a value: `plan` is built from it.
    assert recipe.env["HF_TOKEN"] == "${env.SWAPLAB_TEST_TOKEN}"
    assert recipe.secret_keys == ("HF_TOKEN", "AUTHORIZATION")
    assert [(ref.key, ref.variable, ref.line) for ref in recipe.env_references] == [
        ("HF_TOKEN", "SWAPLAB_TEST_TOKEN", line_of(path, "HF_TOKEN")),
        ("AUTHORIZATION", "SWAPLAB_TEST_TOKEN", line_of(path, "AUTHORIZATION")),
        ("AUTHORIZATION", "SWAPLAB_TEST_USER", line_of(path, "AUTHORIZATION")),
    ]


def test_resolving_fills_whole_and_partial_values_from_the_given_environment(tmp_path):
    recipe = load_recipe(write(tmp_path, SECRET_RECIPE))
    resolved = recipe.resolve_secrets({"SWAPLAB_TEST_TOKEN": "hf_x$y'z", "SWAPLAB_TEST_USER": "me"})
    assert resolved == {"HF_TOKEN": "hf_x$y'z", "AUTHORIZATION": "Bearer hf_x$y'z for me"}


def test_a_missing_variable_is_named_with_the_recipes_file_and_line(tmp_path):
    path = write(tmp_path, SECRET_RECIPE)
    recipe = load_recipe(path)
    with pytest.raises(SwaplabError) as caught:
        recipe.resolve_secrets({"SWAPLAB_TEST_TOKEN": "set"})
    assert str(caught.value) == (
        f"{path}:{line_of(path, 'AUTHORIZATION')}: [env] AUTHORIZATION reads ${{env.SWAPLAB_TEST_USER}}, but "
        "SWAPLAB_TEST_USER is not set in this environment: export it before `swaplab launch up`"
    )


def test_a_shell_style_reference_is_a_fault_that_says_how_to_write_it(tmp_path):
    """`HF_TOKEN = "${HF_TOKEN}"` would reach the server as those characters (the issue's complaint)."""
    path = write(tmp_path, 'engine = "process"\nargs = ["true"]\n\n[env]\nHF_TOKEN = "${HF_TOKEN}"\n')
    assert faults_of(load_recipe, path) == [(
        f"{path}:5: [env] HF_TOKEN holds ${{HF_TOKEN}}, which reaches the server as that literal text; "
        "write ${env.HF_TOKEN} to pass the launching user's HF_TOKEN (read by `up`, never shown)"
    )]



# --- [[pre_serve]] hooks ---------------------------------------------------------------------

PROCESS_RECIPE = 'engine = "process"\nargs = ["server"]\n'


def test_pre_serve_reads_shell_lines_commands_and_copies_relative_to_the_recipe(tmp_path):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fix.patch").write_text("patch\n")
    path = write(tmp_path, PROCESS_RECIPE + """
[[pre_serve]]
copy = [{ from = "mods/fix.patch", to = "fix.patch" }]
run = "patch -p1 < fix.patch && echo patched"

[[pre_serve]]
run = ["echo", "two words"]
""")
    first, second = load_recipe(path).pre_serve
    assert (first.number, first.line) == (1, line_of(path, "[[pre_serve]]"))
    assert first.run == ("sh", "-c", "patch -p1 < fix.patch && echo patched")
    assert [(copy.source, copy.target) for copy in first.copies] == [(tmp_path / "mods" / "fix.patch", "fix.patch")]
    assert (second.number, second.line, second.run, second.copies) == (2, line_of(path, "[[pre_serve]]", 2), ("echo", "two words"), ())


def test_pre_serve_faults_come_at_their_line(tmp_path):
    path = write(tmp_path, PROCESS_RECIPE + """
[[pre_serve]]
run = 3

[[pre_serve]]
run = ["echo", 1]

[[pre_serve]]
copy = [{ from = "missing.txt", to = "x" }]

[[pre_serve]]
copy = [{ to = "x" }]
when = "always"

[[pre_serve]]
""")
    faults = faults_of(load_recipe, path)
    assert f"{path}:{line_of(path, 'run = 3')}" in "\n".join(faults) and "run must be a shell line" in "\n".join(faults), faults
    assert any(fault.startswith(f"{path}:{line_of(path, 'run = [')}:") for fault in faults), faults
    assert any(fault.startswith(f"{path}:{line_of(path, 'missing.txt')}:") and f"{tmp_path / 'missing.txt'} is not a file here" in fault
               for fault in faults), faults
    assert any(fault.startswith(f"{path}:{line_of(path, 'copy = [{ to')}:") and "from" in fault for fault in faults), faults
    assert any(fault.startswith(f"{path}:{line_of(path, 'when =')}:") and "unknown key 'when'" in fault for fault in faults), faults
    assert any(fault.startswith(f"{path}:{line_of(path, '[[pre_serve]]', 5)}:") and "needs run" in fault for fault in faults), faults


def test_a_container_engines_copy_target_is_an_absolute_container_path(tmp_path):
    (tmp_path / "file").write_text("x")
    path = write(tmp_path, """engine = "vllm"
docker_image = "vllm/vllm-openai:v0.11.0"
model = "Qwen/Qwen3-8B"

[[pre_serve]]
copy = [{ from = "file", to = "relative/file" }]
""")
    faults = faults_of(load_recipe, path)
    assert any(fault.startswith(f"{path}:{line_of(path, 'relative/file')}:") and "absolute path in the container" in fault
               for fault in faults), faults


def test_extra_models_may_pin_a_revision_and_images_hold_nothing_a_shell_reads(tmp_path):
    path = write(tmp_path, '''engine = "vllm"
docker_image = "vllm/vllm-openai:v0.11.0;touch"
model = "Qwen/Qwen3-8B"
extra_models = ["org/drafter@v2", "org/other@", "not-a-repo"]
''', "pins.toml")
    assert faults_of(load_recipe, path) == [
        (f'{path}:2: docker_image must be an image reference such as "vllm/vllm-openai:v0.11.0", not a string '
         "'vllm/vllm-openai:v0.11.0;touch': letters, digits and . _ - / : @ only"),
        (f"{path}:4: extra_models must be an array of Hugging Face repo ids (ORG/NAME, or ORG/NAME@REVISION), not an "
         "array ['org/drafter@v2', 'org/other@', 'not-a-repo']: 'org/other@' has no revision after its @ (a branch, tag or commit)"),
    ]
    path = write(tmp_path, '''engine = "vllm"
docker_image = "nvcr.io/nvidia/vllm@sha256:0123"
model = "Qwen/Qwen3-8B"
extra_models = ["org/drafter@v2"]
args = ["--revision", "abc123"]
''', "pinned.toml")
    recipe = load_recipe(path)
    assert [(model.repo, model.revision) for model in recipe.hub_models] == [("Qwen/Qwen3-8B", "abc123"), ("org/drafter", "v2")]


def test_where_models_are_fetched_and_each_hosts_cache_are_checked(tmp_path):
    path = write(tmp_path, '''[clusters.a]
hosts = [{ name = "h", fabric_ip = "10.0.0.1" }]
download = "there"
hf_cache_shared = "yes"

[hosts.h]
hf_cache_dir = "relative/hub"
''', "clusters.toml")
    assert faults_of(load_clusters, path) == [
        f"{path}:3: clusters.a.download must be \"head\" or \"here\", not a string 'there': unknown place 'there'",
        f"{path}:4: clusters.a.hf_cache_shared must be true or false, not a string 'yes'",
        (f"{path}:7: hosts.h.hf_cache_dir must be an absolute path or one starting with ~/, not a string 'relative/hub': "
         "relative paths would depend on where ssh lands"),
    ]


def test_arrays_of_tables_that_are_not_arrays_are_faults_at_their_line(tmp_path):
    path = write(tmp_path, 'engine = "vllm"\ndocker_image = "x"\nmodel = "a/b"\nextra_mounts = 3\npre_serve = "x"\n')
    assert faults_of(load_recipe, path) == [
        f"{path}:4: extra_mounts must be [[extra_mounts]] tables, not an integer",
        f"{path}:5: pre_serve must be [[pre_serve]] tables, not a string",
    ]
