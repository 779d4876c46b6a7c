"""The one gateway to libvirt: raw XML out, nothing parsed here.

This is the only module that imports ``libvirt``. It opens a read-only
connection (the agent never changes the hypervisor) on first use and hands
back XML strings, which ``capabilities``, ``domain``, ``nodedev`` and
``domain_capabilities`` parse. Only ``[libvirt] domain_capabilities = true``
opens a read-write connection, because libvirt refuses
``virConnectGetDomainCapabilities`` read-only; the agent still calls only
reads on it.
Every libvirt failure leaves as a ``DiscoveryError`` naming the URI.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional, TypeVar

import libvirt

from node_agent.errors import CpuExpansionUnsupported, DiscoveryError, DomainCapsRefused

T = TypeVar("T")


def _ignore_libvirt_error(_ctx, _err) -> None:
    """libvirt's default handler prints every error to stderr, even ones we
    catch and report ourselves; the exception carries the same message."""


libvirt.registerErrorHandler(_ignore_libvirt_error, None)

# An object listed a moment ago may be gone by the time we ask for its XML
# (a guest undefined, a VF disabled); that is a normal race, not a failure.
_VANISHED = frozenset({libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_NO_NODE_DEVICE})


@contextmanager
def _undecodable_as_discovery_error(uri: str, what: str) -> Iterator[None]:
    """libvirt-python cannot raise a libvirtError whose message is not UTF-8
    (a path with other bytes, URI-escaped, echoed back): it fails building
    the exception and raises SystemError "returned a result with an
    exception set" from the UnicodeDecodeError. That becomes the
    DiscoveryError every other libvirt failure is, the message's bytes shown
    with \\x escapes."""
    try:
        yield
    except SystemError as exc:
        bad = exc.__cause__ or exc.__context__
        if not isinstance(bad, UnicodeDecodeError):
            raise
        message = bytes(bad.object).decode("utf-8", "backslashreplace")
        raise DiscoveryError(
            f"libvirt at {uri}: cannot {what}: {message} (libvirt's message is "
            "not UTF-8; its other bytes are shown as \\x escapes)"
        ) from None


def _dead(conn: "libvirt.virConnect") -> bool:
    """Whether a call failed because the connection itself is gone."""
    try:
        return not conn.isAlive()
    except libvirt.libvirtError:
        return True


class Hypervisor:
    """A lazily opened libvirt connection, read-only unless ``read_write``.

    ``uri`` is passed to ``libvirt.openReadOnly`` (or ``libvirt.open``)
    unchanged, e.g. ``qemu:///system`` or ``test:///abs/path/host.xml``.
    """

    def __init__(self, uri: str, read_write: bool = False):
        if not uri:
            raise ValueError("a libvirt URI is required (e.g. qemu:///system)")
        self.uri = uri
        self.read_write = read_write
        self._conn: Optional["libvirt.virConnect"] = None

    def _connection(self) -> "libvirt.virConnect":
        if self._conn is None:
            try:
                opener = libvirt.open if self.read_write else libvirt.openReadOnly
                with _undecodable_as_discovery_error(self.uri, "connect"):
                    self._conn = opener(self.uri)
            except libvirt.libvirtError as exc:
                raise DiscoveryError(
                    f"cannot connect to libvirt at {self.uri}: {exc.get_error_message()}"
                ) from exc
        return self._conn

    def _call(self, what: str, fn: Callable[["libvirt.virConnect"], T]) -> T:
        """``fn(connection)``; a libvirt error becomes a DiscoveryError.

        When the kept connection turns out dead (libvirtd restarted since the
        last call: an upgrade, a crash), it is reopened once and ``fn``
        retried, so a restart between cycles costs no failed cycle.
        """
        reused = self._conn is not None
        conn = self._connection()
        try:
            with _undecodable_as_discovery_error(self.uri, what):
                return fn(conn)
        except libvirt.libvirtError as exc:
            if not (reused and _dead(conn)):
                raise DiscoveryError(
                    f"libvirt at {self.uri}: cannot {what}: {exc.get_error_message()}"
                ) from exc
        self.close()
        return self._call(what, fn)  # on a fresh connection: no second retry

    def capabilities_xml(self) -> str:
        """The host capabilities document (``virsh capabilities``)."""
        return self._call("read capabilities", lambda conn: conn.getCapabilities())

    def expand_cpu_features(self, cpu_xml: str) -> str:
        """The CPU with every feature its model implies listed explicitly.

        Capabilities list only the features on top of the named model
        (Haswell implies AVX2 without listing it); traits need them all.
        """
        flags = libvirt.VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES

        def expand(conn: "libvirt.virConnect") -> str:
            try:
                return conn.baselineCPU([cpu_xml], flags)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
                    raise
                raise CpuExpansionUnsupported(
                    f"libvirt at {self.uri} cannot expand CPU features (no "
                    f"baselineCPU): {exc.get_error_message()}"
                ) from exc

        return self._call("expand CPU features", expand)

    def cpu_model_names(self, arch: str) -> list[str]:
        """The CPU models libvirt knows for ``arch`` (``virsh cpu-models``)."""
        return self._call(
            f"list the CPU models of {arch}",
            lambda conn: list(conn.getCPUModelNames(arch, 0) or []),
        )

    def compare_cpu(self, cpu_xml: str) -> Optional[int]:
        """libvirt's compareHypervisorCPU for a guest ``<cpu>``: > 0 when the
        hypervisor can run it on this host, <= 0 when not. None when the
        driver cannot compare (nova then proceeds too) or the connection may
        not ask."""
        conn = self._connection()
        try:
            with _undecodable_as_discovery_error(self.uri, "compare CPUs"):
                return conn.compareHypervisorCPU(None, None, None, None, cpu_xml, 0)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in (
                libvirt.VIR_ERR_NO_SUPPORT,
                libvirt.VIR_ERR_OPERATION_DENIED,
                libvirt.VIR_ERR_ACCESS_DENIED,
            ):
                return None
            if _dead(conn):
                raise DiscoveryError(
                    f"libvirt at {self.uri}: cannot compare CPUs: {exc.get_error_message()}"
                ) from exc
            return 0  # libvirt refuses the CPU itself: incompatible, as nova reads it

    @property
    def is_test_driver(self) -> bool:
        """libvirt's test driver (``test:///...``): it describes an imagined
        host, not the one the agent runs on."""
        return self.uri.split(":", 1)[0].split("+", 1)[0] == "test"

    def memory_mb_total(self) -> int:
        """The host's memory in MiB as libvirt's virNodeGetInfo gives it:
        what nova's ``Host.get_memory_mb_total`` reports as MEMORY_MB. On
        Linux libvirt sums the NUMA nodes' MemTotal, which can be less than
        the kernel's /proc/meminfo MemTotal (memory outside every node)."""
        return self._call("read the node info", lambda conn: int(conn.getInfo()[1]))

    def versions(self) -> tuple[int, int]:
        """(libvirt version, hypervisor version), each major*1e6+minor*1e3+micro."""
        return self._call("read versions", lambda conn: (conn.getLibVersion(), conn.getVersion()))

    def hv_type(self) -> str:
        """The connection's driver name (``virConnectGetType``): QEMU, Test..."""
        return self._call("read the hypervisor type", lambda conn: conn.getType())

    def hostname(self) -> str:
        """libvirt's name for this host (``virConnectGetHostname``: the
        machine's hostname, made fully qualified by the resolver when it
        has no dot): what nova names its compute node and root provider."""
        return self._call("read the hostname", lambda conn: conn.getHostname())

    def domain_capabilities_xml(
        self, emulator: Optional[str], arch: str, machine: Optional[str], virt_type: str
    ) -> Optional[str]:
        """``virsh domcapabilities`` for one emulator, arch and machine type.

        None when libvirt cannot run that combination (KVM for a foreign
        architecture, a machine type the emulator lacks): nova then leaves
        the architecture out, and so does the agent. A refusal (no rights, a
        read-only connection, a driver without them) is DomainCapsRefused.
        """
        conn = self._connection()
        try:
            with _undecodable_as_discovery_error(self.uri, "read domain capabilities"):
                return conn.getDomainCapabilities(emulator, arch, machine, virt_type, 0)
        except libvirt.libvirtError as exc:
            if _dead(conn):
                raise DiscoveryError(
                    f"libvirt at {self.uri}: cannot read domain capabilities: "
                    f"{exc.get_error_message()}"
                ) from exc
            if exc.get_error_code() in (
                libvirt.VIR_ERR_OPERATION_DENIED,
                libvirt.VIR_ERR_ACCESS_DENIED,
                libvirt.VIR_ERR_NO_SUPPORT,
            ):
                raise DomainCapsRefused(
                    f"libvirt at {self.uri} refused domain capabilities: {exc.get_error_message()}"
                ) from exc
            return None

    def domain_xmls(self) -> list[tuple[str, bool]]:
        """``(XMLDesc, running)`` for every running and defined domain.

        A domain that disappears between listing and reading is skipped.
        """
        domains = self._call("list domains", lambda conn: conn.listAllDomains(0))
        result = []
        for dom in domains:
            try:
                with _undecodable_as_discovery_error(self.uri, "read a domain"):
                    result.append((dom.XMLDesc(0), bool(dom.isActive())))
            except libvirt.libvirtError as exc:
                if exc.get_error_code() in _VANISHED:
                    continue
                raise DiscoveryError(
                    f"libvirt at {self.uri}: cannot read domain {dom.UUIDString()}: "
                    f"{exc.get_error_message()}"
                ) from exc
        return result

    def node_device_xmls(self, cap: Optional[str] = None) -> list[str]:
        """Node-device XML of every device, or only those with capability
        ``cap`` (libvirt's names: ``pci``, ``mdev``, ``mdev_types``, ``net``...).

        A device that disappears between listing and reading is skipped.
        """
        names = self._call(f"list node devices (cap={cap})", lambda conn: conn.listDevices(cap, 0))
        conn = self._connection()
        result = []
        for name in names:
            try:
                with _undecodable_as_discovery_error(self.uri, f"read node device {name}"):
                    result.append(conn.nodeDeviceLookupByName(name).XMLDesc(0))
            except libvirt.libvirtError as exc:
                if exc.get_error_code() in _VANISHED:
                    continue
                raise DiscoveryError(
                    f"libvirt at {self.uri}: cannot read node device {name}: "
                    f"{exc.get_error_message()}"
                ) from exc
        return result

    def close(self) -> None:
        """Close the connection if open; the next call reopens it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except libvirt.libvirtError:
                pass  # closing a dead connection has nothing left to release

    def __enter__(self) -> "Hypervisor":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()
