"""A table of invalid configurations, each run through the real CLI.

Every row must end with exit 78, a message naming the option (or, for an
operator provider file, the file and the key inside it) and the offending
value, no traceback and nothing on stdout. The rows run concurrently in
subprocesses (one module-scoped batch) so the table stays cheap to grow.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cli.runner import run_agent, write_config
from tests.hostdata import HOSTDATA

# 8 CPUs present (0-7), 5 and 7 offline, 8183 MiB in its node meminfo.
TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"
DRY = ("--once", "--dry-run")
ONCE = ("--once",)
SECRET = "S3cr3t-Rabbit-Pw"


@dataclass(frozen=True)
class Case:
    id: str
    text: str  # appended to a valid config (inside [compute])
    fragments: tuple[str, ...]  # each must appear in stderr
    files: dict = field(default_factory=dict)  # provider files: name -> YAML
    args: tuple[str, ...] = DRY
    kind: str = "extra"  # extra | raw (whole file) | directory | missing


def yaml_doc(providers: str, version: str = "'1.0'") -> str:
    return f"meta:\n  schema_version: {version}\nproviders:\n{providers}"


def root_entry(body: str) -> str:
    return "  - identification:\n      uuid: $COMPUTE_NODE\n" + body


PROVIDERS = "provider_config_location = {providers}\n"


def provider_case(id, yaml_text, *fragments, name="site.yaml", more=None):
    files = {name: yaml_text, **(more or {})}
    return Case(id, PROVIDERS, (name, *fragments), files)


CASES = [
    # --- CPU spec grammar
    Case(
        "cpu-spec-letter",
        "cpu_dedicated_set = 0-3,x\n",
        ("[compute] cpu_dedicated_set = '0-3,x'", "'x'"),
    ),
    Case("cpu-spec-word", "cpu_shared_set = all\n", ("[compute] cpu_shared_set = 'all'",)),
    Case(
        "cpu-spec-backwards",
        "cpu_dedicated_set = 3-1\n",
        ("cpu_dedicated_set = '3-1'", "backwards"),
    ),
    # "cpu_dedicated_set =" (empty) means unset, as in nova: tests/unit/test_nova_conf.py.
    Case(
        "cpu-spec-all-excluded",
        "cpu_dedicated_set = 0-3,^0-3\n",
        ("cpu_dedicated_set = '0-3,^0-3'", "leaves no CPU"),
    ),
    Case(
        "cpu-spec-double-comma",
        "cpu_shared_set = 0,,1\n",
        ("cpu_shared_set = '0,,1'", "empty item"),
    ),
    Case(
        "cpu-spec-huge-id",
        "cpu_dedicated_set = 0-99999999\n",
        ("cpu_dedicated_set = '0-99999999'", "65535"),
    ),
    Case("cpu-spec-negative", "cpu_dedicated_set = -1\n", ("cpu_dedicated_set = '-1'",)),
    Case("cpu-spec-fraction", "cpu_shared_set = 1.5\n", ("cpu_shared_set = '1.5'",)),
    Case("cpu-spec-double-dash", "vcpu_pin_set = 1--2\n", ("vcpu_pin_set = '1--2'",)),
    Case("cpu-spec-bare-caret", "cpu_shared_set = 0-1,^\n", ("cpu_shared_set = '0-1,^'",)),
    # --- sets that cannot go together
    Case(
        "overlap-one-cpu",
        "cpu_dedicated_set = 0-3\ncpu_shared_set = 3-4\n",
        ("cpu_dedicated_set = '0-3'", "cpu_shared_set = '3-4'", "overlap on CPUs 3"),
    ),
    Case(
        "overlap-same-set",
        "cpu_dedicated_set = 0-2\ncpu_shared_set = 0-2\n",
        ("overlap on CPUs 0-2",),
    ),
    Case(
        "vcpu-pin-with-dedicated",
        "vcpu_pin_set = 0-1\ncpu_dedicated_set = 2-3\n",
        ("vcpu_pin_set = '0-1'", "cpu_dedicated_set = '2-3'"),
    ),
    Case(
        "reserved-cpus-with-shared-set",
        "reserved_host_cpus = 1\ncpu_shared_set = 0-3\n",
        ("reserved_host_cpus = 1", "cpu_shared_set"),
    ),
    # --- CPUs the host has offline or not at all
    Case(
        "offline-in-dedicated",
        "cpu_dedicated_set = 4-7\n",
        ("cpu_dedicated_set = '4-7'", "offline CPUs 5,7"),
    ),
    Case("offline-in-shared", "cpu_shared_set = 5\n", ("cpu_shared_set = '5'", "offline CPUs 5")),
    Case(
        "offline-in-vcpu-pin", "vcpu_pin_set = 0-7\n", ("vcpu_pin_set = '0-7'", "offline CPUs 5,7")
    ),
    Case(
        "absent-in-shared",
        "cpu_shared_set = 0-9\n",
        ("cpu_shared_set = '0-9'", "CPUs 8-9", "does not have"),
    ),
    Case(
        "absent-in-dedicated",
        "cpu_dedicated_set = 64\n",
        ("cpu_dedicated_set = '64'", "CPUs 64", "does not have"),
    ),
    # --- allocation ratios
    # 0.0 means unset, as in nova (its default before Stein).
    Case("cpu-ratio-negative", "cpu_allocation_ratio = -2\n", ("cpu_allocation_ratio = -2.0",)),
    Case("ram-ratio-negative", "ram_allocation_ratio = -1\n", ("ram_allocation_ratio = -1.0",)),
    Case(
        "disk-ratio-negative", "disk_allocation_ratio = -0.5\n", ("disk_allocation_ratio = -0.5",)
    ),
    Case(
        "initial-cpu-ratio-zero",
        "initial_cpu_allocation_ratio = 0\n",
        ("initial_cpu_allocation_ratio = 0.0",),
    ),
    Case("cpu-ratio-nan", "cpu_allocation_ratio = nan\n", ("cpu_allocation_ratio = nan",)),
    Case("ram-ratio-infinite", "ram_allocation_ratio = inf\n", ("ram_allocation_ratio = inf",)),
    Case(
        "cpu-ratio-text",
        "cpu_allocation_ratio = lots\n",
        ("[compute] cpu_allocation_ratio", "'lots'"),
    ),
    # --- negative reservations
    Case(
        "reserved-memory-negative",
        "reserved_host_memory_mb = -1\n",
        ("[compute] reserved_host_memory_mb", "-1"),
    ),
    Case(
        "reserved-disk-negative",
        "reserved_host_disk_mb = -5\n",
        ("[compute] reserved_host_disk_mb", "-5"),
    ),
    Case(
        "reserved-cpus-negative",
        "reserved_host_cpus = -2\n",
        ("[compute] reserved_host_cpus", "-2"),
    ),
    # --- reservations that leave nothing
    Case(
        "reserved-memory-above-total",
        "reserved_host_memory_mb = 999999\n",
        ("reserved_host_memory_mb = 999999", "8183 MiB"),
    ),
    Case(
        "reserved-memory-equal-total",
        "reserved_host_memory_mb = 8183\n",
        ("reserved_host_memory_mb = 8183", "8183 MiB"),
    ),
    Case(
        "reserved-cpus-all",
        "reserved_host_cpus = 6\n",
        ("reserved_host_cpus = 6", "not below the 6"),
    ),
    Case(
        "reserved-disk-above-total",
        "reserved_host_disk_mb = 1073741824\n",
        ("reserved_host_disk_mb = 1073741824", "GiB"),
    ),
    # --- resource class and trait names
    Case(
        "node-class-not-custom",
        "[node]\nresource_class = BAREMETAL_GOLD\n",
        ("[node] resource_class = 'BAREMETAL_GOLD'", "CUSTOM_BAREMETAL_GOLD"),
    ),
    Case(
        "node-class-lower-case",
        "[node]\nresource_class = CUSTOM_gold\n",
        ("[node] resource_class = 'CUSTOM_gold'",),
    ),
    Case(
        "node-class-standard",
        "[node]\nresource_class = VCPU\n",
        ("[node] resource_class = 'VCPU'",),
    ),
    provider_case(
        "provider-class-standard",
        yaml_doc(
            root_entry(
                "    inventories:\n      additional:\n        - VCPU:\n            total: 4\n"
            )
        ),
        "providers[0].inventories.additional[0].VCPU",
        "'VCPU'",
    ),
    provider_case(
        "provider-class-agent-page",
        yaml_doc(
            root_entry(
                "    inventories:\n      additional:\n"
                "        - CUSTOM_MEMORY_PAGE_2048:\n"
                "            total: 4\n"
            )
        ),
        "CUSTOM_MEMORY_PAGE_2048",
        "agent reports itself",
    ),
    provider_case(
        "provider-trait-standard",
        yaml_doc(root_entry("    traits:\n      additional:\n        - HW_CPU_X86_AVX2\n")),
        "providers[0].traits.additional[0]",
        "'HW_CPU_X86_AVX2'",
    ),
    provider_case(
        "provider-trait-lower-case",
        yaml_doc(root_entry("    traits:\n      additional:\n        - CUSTOM_gold\n")),
        "providers[0].traits.additional[0]",
        "'CUSTOM_gold'",
    ),
    Case(
        "pci-spec-not-json",
        "[pci]\ndevice_spec = address=0000:81:00.0\n",
        ("[pci] device_spec = 'address=0000:81:00.0'", "not JSON"),
    ),
    Case(
        "pci-spec-unknown-key",
        '[pci]\ndevice_spec = {"adress": "0000:81:00.0", "physical_network": "p1"}\n',
        ("[pci] device_spec", '"adress"', "unknown key(s) adress"),
    ),
    Case(
        "pci-spec-bad-vendor",
        '[pci]\ndevice_spec = {"vendor_id": "80866", "physical_network": "p1"}\n',
        ("[pci] device_spec", "vendor_id '80866'"),
    ),
    Case(
        "pci-spec-address-and-devname",
        '[pci]\ndevice_spec = {"address": "0000:81:00.0", "devname": "eth0"}\n',
        ("[pci] device_spec", '"devname": "eth0"', "not both"),
    ),
    Case(
        "pci-spec-partial-wildcard",
        '[pci]\ndevice_spec = {"address": "*:8*:00.*"}\n',
        ("[pci] device_spec", "bus '8*' is not a hex number or *", '{"bus": "8[12]"'),
    ),
    Case(
        "pci-spec-slot-above-1f",
        '[pci]\ndevice_spec = {"address": "0000:81:20.0"}\n',
        ("[pci] device_spec", "slot '20' is above 1F"),
    ),
    Case(
        "pci-spec-bad-regex",
        '[pci]\ndevice_spec = {"address": {"bus": "8[1"}, "physical_network": "p1"}\n',
        ("[pci] device_spec", "bus '8[1' is not a regular expression"),
    ),
    Case(
        "pci-spec-regex-misspelt-key",
        '[pci]\ndevice_spec = {"address": {"bus": "81", "func": "1"}}\n',
        ("[pci] device_spec", "unknown key(s) func", "domain, bus, slot and function"),
    ),
    Case(
        "huge-pages-no-count",
        "reserved_huge_pages = node:0,size:2M\n",
        ("[compute] reserved_huge_pages = 'node:0,size:2M'", "count missing"),
    ),
    Case(
        "huge-pages-bad-unit",
        "reserved_huge_pages = node:0,size:2X,count:1\n",
        ("[compute] reserved_huge_pages = 'node:0,size:2X,count:1'", "'2X'"),
    ),
    # --- malformed provider files
    provider_case("provider-yaml-syntax", "meta: [unclosed\n", "not valid YAML"),
    provider_case("provider-yaml-no-version", "providers: []\n", "meta.schema_version", "None"),
    provider_case(
        "provider-yaml-version-2", yaml_doc("  []\n", "'2.0'"), "meta.schema_version", "'2.0'"
    ),
    provider_case("provider-yaml-scalar", "just some text\n", "must be a mapping, not str"),
    provider_case(
        "provider-yaml-providers-mapping",
        "meta:\n  schema_version: '1.0'\nproviders:\n  a: 1\n",
        "providers",
        "must be a list",
    ),
    provider_case(
        "provider-total-negative",
        yaml_doc(
            root_entry(
                "    inventories:\n      additional:\n"
                "        - CUSTOM_LICENSE:\n            total: -4\n"
            )
        ),
        "CUSTOM_LICENSE.total",
        "-4",
    ),
    provider_case(
        "provider-reserved-above-total",
        yaml_doc(
            root_entry(
                "    inventories:\n      additional:\n"
                "        - CUSTOM_LICENSE:\n            total: 4\n"
                "            reserved: 9\n"
            )
        ),
        "CUSTOM_LICENSE.reserved",
        "9 is above total 4",
    ),
    provider_case(
        "provider-ratio-zero",
        yaml_doc(
            root_entry(
                "    inventories:\n      additional:\n"
                "        - CUSTOM_LICENSE:\n            total: 4\n"
                "            allocation_ratio: 0\n"
            )
        ),
        "CUSTOM_LICENSE.allocation_ratio",
        "0 must be a number > 0",
    ),
    provider_case(
        "provider-ratio-nan",
        yaml_doc(
            root_entry(
                "    inventories:\n      additional:\n"
                "        - CUSTOM_LICENSE:\n            total: 4\n"
                "            allocation_ratio: .nan\n"
            )
        ),
        "CUSTOM_LICENSE.allocation_ratio",
        "nan must be a number > 0",
    ),
    provider_case(
        "provider-total-above-placement-max",
        yaml_doc(
            root_entry(
                "    inventories:\n      additional:\n"
                "        - CUSTOM_LICENSE:\n"
                "            total: 99999999999\n"
            )
        ),
        "CUSTOM_LICENSE.total",
        "99999999999",
        "2147483647",
    ),
    provider_case(
        "provider-bad-uuid",
        yaml_doc("  - identification:\n      uuid: not-a-uuid\n"),
        "identification.uuid",
        "'not-a-uuid'",
    ),
    provider_case(
        "provider-unknown-key-in-1.0",
        yaml_doc(root_entry("    colour: blue\n")),
        "providers[0]",
        "unknown key(s) colour",
    ),
    provider_case(
        "provider-same-provider-twice",
        yaml_doc(root_entry("    traits:\n      additional:\n        - CUSTOM_A\n")),
        "$COMPUTE_NODE",
        "already used",
        name="a.yaml",
        more={
            "b.yaml": yaml_doc(root_entry("    traits:\n      additional:\n        - CUSTOM_B\n"))
        },
    ),
    # --- messaging
    Case(
        "transport-url-no-scheme",
        "[DEFAULT]\ntransport_url = //rabbit1:5672/\n",
        ("[DEFAULT] transport_url = '//rabbit1:5672/'", "No scheme"),
    ),
    Case(
        "transport-url-host-port-only",
        "[DEFAULT]\ntransport_url = rabbit-host:5672\n",
        ("[DEFAULT] transport_url = 'rabbit-host:5672'", "no messaging driver"),
    ),
    Case(
        "transport-url-bad-port",
        f"[DEFAULT]\ntransport_url = rabbit://agent:{SECRET}@rabbit1:notaport/\n",
        ("[DEFAULT] transport_url = 'rabbit://agent:***@rabbit1:notaport/'", "notaport"),
    ),
    Case(
        "transport-url-unknown-driver",
        "[DEFAULT]\ntransport_url = amqp9://rabbit1/\n",
        ("[DEFAULT] transport_url = 'amqp9://rabbit1/'", "no messaging driver 'amqp9'"),
    ),
    Case(
        "transport-url-port-range",
        "[DEFAULT]\ntransport_url = rabbit://rabbit1:99999/\n",
        ("[DEFAULT] transport_url = 'rabbit://rabbit1:99999/'", "port 99999"),
    ),
    Case(
        "notification-transport-url",
        "[oslo_messaging_notifications]\ntransport_url = nope\n",
        ("[oslo_messaging_notifications] transport_url = 'nope'",),
    ),
    # --- Placement credentials (the client is only built by --once)
    Case(
        "auth-password-without-url",
        "[placement]\nauth_type = password\n",
        ("[placement] auth_type=password", "auth_url"),
        args=ONCE,
    ),
    Case(
        "auth-unknown-plugin",
        "[placement]\nauth_type = passwd\n",
        ("[placement] auth_type='passwd'", "not a known"),
        args=ONCE,
    ),
    Case(
        "placement-timeout-text", "[placement]\ntimeout = soon\n", ("[placement] timeout", "'soon'")
    ),
    # [placement] is checked against the configured auth type's options only
    Case(
        "placement-option-typo",
        "[placement]\nauth_type = password\nauth_url = http://k/\nusernme = nova\n",
        ("unknown option [placement] usernme",),
    ),
    Case(
        "placement-option-of-another-auth-type",
        "[placement]\nauth_type = password\napplication_credential_secret = x\n",
        ("unknown option [placement] application_credential_secret",),
    ),
    Case(
        "placement-typo-and-bad-cpu-set-in-one-pass",
        "cpu_dedicated_set = 0-3,x\n[placement]\nauth_type = none\nendpont_override = x\n",
        ("[compute] cpu_dedicated_set = '0-3,x'", "unknown option [placement] endpont_override"),
    ),
    # --- service options only the daemon reads (still checked up front)
    Case(
        "report-interval-zero", "[agent]\nreport_interval = 0\n", ("[agent] report_interval", "0")
    ),
    Case(
        "interval-jitter-above-max",
        "[agent]\ninterval_jitter = 0.9\n",
        ("[agent] interval_jitter", "0.9"),
    ),
    Case(
        "metrics-port-out-of-range",
        "[agent]\nmetrics_port = 70000\n",
        ("[agent] metrics_port", "70000"),
    ),
    Case(
        "bool-not-a-bool",
        "pcpu_transition_mode = maybe\n",
        ("[compute] pcpu_transition_mode", "maybe"),
    ),
    Case("host-name-empty", "[DEFAULT]\nhost =\n", ("[DEFAULT] host is empty",)),
    Case(
        "aggregate-not-a-uuid",
        "[placement]\naggregates = 2b4c8a3e-5f1d-4e0a-9c6b-7d8e9f0a1b2c,rack-12\n",
        ("[placement] aggregates: 'rack-12' is not an aggregate UUID",),
    ),
    Case(
        "aggregate-with-companion",
        "[agent]\nmode = companion\n[placement]\n"
        "aggregates = 2b4c8a3e-5f1d-4e0a-9c6b-7d8e9f0a1b2c\n",
        (
            "[placement] aggregates = 2b4c8a3e-5f1d-4e0a-9c6b-7d8e9f0a1b2c",
            "mode = companion never writes the root",
        ),
    ),
    # --- the file itself
    Case(
        "unknown-option",
        "cpu_dedicated_sets = 1\n",
        ("unknown option [compute] cpu_dedicated_sets",),
    ),
    Case("unknown-section", "[computer]\ncpu_shared_set = 1\n", ("unknown section [computer]",)),
    Case(
        "file-unparsable",
        "[compute\ncpu_shared_set = 1\n",
        ("cannot be parsed", "[compute"),
        kind="raw",
    ),
    Case("file-is-a-directory", "", ("node-agent.conf",), kind="directory"),
    Case("file-missing", "", ("node-agent.conf", "not found or unreadable"), kind="missing"),
]


def _prepare(case: Case, tmp: Path) -> Path:
    tmp.mkdir(parents=True)
    providers = tmp / "providers"
    providers.mkdir()
    for name, text in case.files.items():
        (providers / name).write_text(text)
    if case.kind == "extra":
        return write_config(tmp, TEST6, extra=case.text.replace("{providers}", str(providers)))
    path = tmp / "node-agent.conf"
    if case.kind == "raw":
        path.write_text(case.text)
    elif case.kind == "directory":
        path.mkdir()
    return path


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every row run once, four at a time."""
    base = tmp_path_factory.mktemp("bad-config")

    def run(case: Case):
        config = _prepare(case, base / case.id)
        return run_agent("--config-file", str(config), *case.args)

    with ThreadPoolExecutor(max_workers=4) as pool:
        done = dict(zip([c.id for c in CASES], pool.map(run, CASES)))
    yield done
    shutil.rmtree(base, ignore_errors=True)


def test_the_table_has_at_least_40_distinct_rows():
    assert len({c.id for c in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_config_exits_78_naming_option_and_value(case, results):
    result = results[case.id]
    assert result.code == 78, (result.code, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    for fragment in case.fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert SECRET not in result.stderr
