"""comms.torch: the torch.distributed backend "comms" (docs/TORCH.md).

    torch.distributed.init_process_group("comms")   # torch finds the backend by its entry point
    import comms.torch                              # or registers it by import

Groups bootstrap through the store torch hands the backend (each group under
its own prefix). Their comms backends come from COMMS_BACKEND (e.g.
"cpu:ucx,cuda:nccl") unless Options(backend=...) names them; COMMS_ROUTE
chooses how new_group creates a group, as in comms.dist. Everything goes
through torch's public backend hooks (register_backend, Backend.split,
shrink, shutdown, abort); nothing of torch is patched.
"""
import datetime
import gc
import math
import os
import sys

import torch  # noqa: F401  (torch's C++ classes must exist before _C loads)
import torch.distributed as _dist
from torch.distributed import distributed_c10d as _c10d

from .. import _comms  # noqa: F401  (comms.Error)
from .. import dist as _comms_dist
from . import _C

ProcessGroupComms = _C.ProcessGroupComms

# NCCL's and Gloo's knobs as torch and Megatron spell them: comms::dist's one table.
_TYPES = {"bool": bool, "int": int, "str": str}
_NCCL_FIELDS = {k: _TYPES[t] for k, (b, t, _) in _comms_dist.option_spellings().items() if b == "nccl"}
_GLOO_FIELDS = {k: _TYPES[t] for k, (b, t, _) in _comms_dist.option_spellings().items() if b == "gloo"}
_OWN_FIELDS = ("backend", "timeout", "init_timeout", "hints", "device")


def _seconds(name, value):
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("comms.torch.Options: %s must be a positive timedelta or number of seconds, not %r"
                         % (name, value))
    return datetime.timedelta(seconds=value)


class Options(_C._CommsOptions):
    """pg_options of init_process_group / new_group for backend "comms".

    backend        comms backends, e.g. "cpu:ucx" or "cpu:gloo,cuda:nccl" (default: COMMS_BACKEND)
    timeout        op timeout (timedelta or seconds); overrides init_process_group's timeout
    init_timeout   how long creating the group's comm may take
    hints          comms hints: {"key": "value"} or "k=v,k=v"
    device         binds eagerly ("cpu", "cuda:0"): the backend connects before the call returns
    and NCCL's knobs as torch and Megatron name them (is_high_priority_stream,
    cga_cluster_size, min_ctas, max_ctas, net_name, ...) and Gloo's (interface,
    hostname, busy_poll). An unknown name or a bad value raises ValueError.
    """

    def __init__(self, **options):
        _C._CommsOptions.__init__(self)  # the C++ half torch keeps (split_group's pg_options)
        self.__dict__["_ready"] = False
        self.backend = None
        self.timeout = None
        self.init_timeout = None
        self.hints = {}
        self.device = None
        self.nccl = {}
        self.gloo = {}
        for key, value in options.items():
            setattr(self, key, value)
        self.__dict__["_ready"] = True
        self._sync()

    # torch's Backend.Options has a read-only `backend` (its own name): ours
    # is the comms backend string.
    backend = property(lambda self: self.__dict__.get("backend"))

    def _sync(self):
        """Hands the translated options to the C++ half, where split() reads them."""
        if self.__dict__.get("_ready"):
            ms = lambda t: None if t is None else datetime.timedelta(seconds=t.total_seconds())  # noqa: E731
            self._set_config(self.backend or "", self.to_hints(), ms(self.timeout), ms(self.init_timeout))

    def __setattr__(self, key, value):
        self._set(key, value)
        self._sync()

    def _set(self, key, value):
        if key in ("nccl", "gloo") and isinstance(value, dict) and not value:
            self.__dict__[key] = value
        elif key in _NCCL_FIELDS or key in _GLOO_FIELDS:
            kind = _NCCL_FIELDS.get(key) or _GLOO_FIELDS[key]
            if type(value) is not kind:  # noqa: E721  (True is not an int here)
                raise ValueError("comms.torch.Options: %s must be %s, not %r" % (key, kind.__name__, value))
            (self.nccl if key in _NCCL_FIELDS else self.gloo)[key] = value
        elif key in _OWN_FIELDS:
            self.__dict__[key] = self._checked(key, value)
        else:
            raise ValueError("comms.torch.Options: unknown option '%s' (options: %s)"
                             % (key, ", ".join(sorted(_OWN_FIELDS + tuple(_NCCL_FIELDS) + tuple(_GLOO_FIELDS)))))

    def __getattr__(self, key):
        fields = self.__dict__
        if key in _NCCL_FIELDS:
            return fields["nccl"].get(key)
        if key in _GLOO_FIELDS:
            return fields["gloo"].get(key)
        raise AttributeError(key)

    @staticmethod
    def _checked(key, value):
        if value is None:
            return {} if key == "hints" else None
        if key in ("timeout", "init_timeout"):
            return _seconds(key, value)
        if key == "hints":
            if isinstance(value, str):
                return dict(_comms.parse_hints(value))
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise ValueError("comms.torch.Options: hints must be a dict or 'k=v,k=v', not %r" % (value,))
            return {k: str(v) for k, v in value.items()}
        if not isinstance(value, str):
            raise ValueError("comms.torch.Options: %s must be a string, not %r" % (key, value))
        return value

    def to_hints(self):
        """The comms hints these options become (comms.dist.to_hints: the same translation)."""
        try:
            return dict(_comms_dist.to_hints({"nccl": dict(self.nccl), "gloo": dict(self.gloo),
                                              "hints": dict(self.hints)}))
        except RuntimeError as e:  # a field also given as a raw hint
            raise ValueError("comms.torch.Options: %s" % e) from None

    def __repr__(self):
        set_ = {k: getattr(self, k) for k in _OWN_FIELDS if getattr(self, k) not in (None, {})}
        set_.update(self.nccl)
        set_.update(self.gloo)
        return "comms.torch.Options(%s)" % ", ".join("%s=%r" % kv for kv in sorted(set_.items()))


def _from_nccl_options(pg_options):
    """torch's ProcessGroupNCCL.Options, translated as comms.dist translates
    Megatron's. Its _timeout is not taken: torch's NCCL backend overrides it
    with the group's timeout, and so does comms (Megatron's
    distributed_timeout_minutes reaches the groups it gives options)."""
    options = Options(is_high_priority_stream=bool(pg_options.is_high_priority_stream))
    config = getattr(pg_options, "config", None)
    for key, kind in _NCCL_FIELDS.items():
        value = getattr(config, key, None) if config is not None else None
        # NCCL's "undefined" sentinels (INT_MIN, null strings) leave the default.
        if kind is int and isinstance(value, int) and value >= 0:
            setattr(options, key, value)
        elif kind is str and isinstance(value, str) and value:
            setattr(options, key, value)
    return options


def _options_of(pg_options):
    if pg_options is None:
        return Options()
    if isinstance(pg_options, Options):
        return pg_options
    nccl_options = getattr(getattr(_c10d, "ProcessGroupNCCL", None), "Options", None)
    if nccl_options is not None and isinstance(pg_options, nccl_options):
        return _from_nccl_options(pg_options)
    raise ValueError("comms.torch: pg_options must be comms.torch.Options, not %s" % type(pg_options).__name__)


_state = {"generation": 0, "names": {}}


def _unique_name(name):
    """Comm names are unique in a process and key the rendezvous: a group torch
    creates twice gets a suffix, in the same order on every rank."""
    seen = _state["names"].get(name, 0)
    _state["names"][name] = seen + 1
    return name if seen == 0 else "%s.%d" % (name, seen)


def _backend_of(pg):
    """The comms backend behind a torch group, or None."""
    if isinstance(pg, ProcessGroupComms):
        return pg
    get = getattr(pg, "_get_backend", None)  # a ProcessGroup of per-device backends
    if get is not None:
        for device in ("cpu", "cuda"):
            try:
                backend = get(torch.device(device))
            except (RuntimeError, ValueError):
                continue
            if isinstance(backend, ProcessGroupComms):
                return backend
    return None


def _timeout_of(torch_timeout, explicit, variable):
    """Options' value, else torch's timeout for the group. torch's default
    (30 min) gives way to comms' environment variable where one is set."""
    if explicit is not None:
        return explicit
    if torch_timeout is None or (torch_timeout == _c10d.default_pg_timeout and os.environ.get(variable)):
        return None  # comms reads COMMS_OP_TIMEOUT / COMMS_INIT_TIMEOUT
    return datetime.timedelta(seconds=torch_timeout.total_seconds())


def _create(opts, pg_options):
    """torch's creator (extended API): opts is c10d's _DistributedBackendOptions."""
    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    group_id, global_ranks = str(opts.group_id), list(opts.global_ranks_in_group)
    options = _options_of(pg_options)
    hints = options.to_hints()
    op_timeout = _timeout_of(timeout, options.timeout, "COMMS_OP_TIMEOUT")
    init_timeout = _timeout_of(timeout, options.init_timeout, "COMMS_INIT_TIMEOUT")
    backend = options.backend or ""
    split_from = getattr(opts, "split_from", None)
    if not global_ranks:  # the world: a new generation of names
        _state["generation"] += 1
        _state["names"] = {}
    if global_ranks and isinstance(split_from, ProcessGroupComms):
        # torch splits from a device-bound world (device_id=, or COMMS_ROUTE=split);
        # non-members take part through perform_nocolor_split.
        name = "torch%d.%s" % (_state["generation"], group_id)
        return _C.split(split_from, global_ranks, name, backend, hints, op_timeout, init_timeout)
    device = options.device
    if not global_ranks and _comms_dist.route_from_environment() == "split":
        # The split route carves every new_group from the world: the world
        # binds eagerly, and torch routes new_group through split() when the
        # world has a bound device (init_process_group's device_id, else cpu).
        pg = opts.process_group
        if pg.bound_device_id is None:
            pg.bound_device_id = torch.device("cpu", 0)
        if device is None:
            device = str(pg.bound_device_id)
    name = _unique_name("torch%d.%s" % (_state["generation"], group_id))
    return _C.create(store, rank, size, name, backend, hints, op_timeout, init_timeout, device)


def describe(group=None):
    """The effective configuration of a group's comm, as JSON (comms' describe())."""
    return _comms_backend(group, "describe").describe()


def _live_groups():
    """Every comms group of this process, in creation order (the same on every rank)."""
    return [b for b in (_backend_of(pg) for pg in list(_c10d._pg_map)) if b is not None and not b.is_finalized]


def offload_groups(device_types=("cuda",)):
    """Releases the Gloo/UCX/NCCL state of `device_types` in every comms group,
    keeping each group and every option. Collective. Returns how many
    backends were released."""
    return sum(1 for b in _live_groups() for t in device_types if b.offload(t))


def reload_groups(device_types=("cuda",)):
    """Recreates what offload_groups released, with the same options. Collective."""
    return sum(1 for b in _live_groups() for t in device_types if b.reload(t))


def _torch_registry():
    """The containers of torch.distributed's own bookkeeping (its private
    module globals and _World's state, one level of nesting): what holds
    every group whether or not the program still uses it."""
    found = []
    state = [v for k, v in vars(_c10d).items() if k.startswith("_")] + list(vars(_c10d._world).values())
    for value in state:
        if isinstance(value, (dict, list)):
            found.append(value)
            if isinstance(value, dict):
                found += [v for v in value.values() if isinstance(v, (dict, list))]
    return found


def _registry_holds(pg, registry):
    count = 0
    for container in registry:
        if isinstance(container, dict):
            count += sum(1 for k in container if k is pg) + sum(1 for v in container.values() if v is pg)
        else:
            count += sum(1 for v in container if v is pg)
    return count


def _references(obj):
    return sys.getrefcount(obj)


def destroy_unreferenced_groups():
    """Destroys every comms group that nothing but torch's own bookkeeping
    holds: what Megatron's destroy_model_parallel() leaves behind when it sets
    its globals to None (torch keeps each group, and its comm, until
    destroy_process_group). A group the program still holds anywhere (a
    variable, an attribute, a list) is kept, as is the world. Call it on every
    rank at the same point, like destroy_process_group: the groups go in
    creation order, the same on every rank. Returns how many it destroyed; a
    comm that fails to release raises comms.Error."""
    unreferenced, all_unreferenced = _unreferenced_groups()
    if not all_unreferenced:
        # Some group is still referenced: maybe only by a cycle, which a full
        # collection frees. It walks the whole heap (a large share of a
        # second in a process holding torch and Megatron), so only then.
        unreferenced = None  # its references would count in the second look
        gc.collect()
        unreferenced, _ = _unreferenced_groups()
    for pg in unreferenced:
        _dist.destroy_process_group(pg)
    return len(unreferenced)


def _unreferenced_groups():
    """The comms groups, in creation order, that only torch's bookkeeping
    holds, and whether that is every comms group but the world."""
    world = _c10d._get_default_group() if _dist.is_initialized() else None
    candidates = [pg for pg in list(_c10d._pg_map) if pg is not world and _backend_of(pg) is not None]
    if not candidates:
        return [], True
    registry = _torch_registry()
    # References this function itself holds, measured on an object held the
    # same way (in a list, through a loop variable): refcounts differ across
    # Python releases, the difference to a probe does not.
    probes = [object()]
    own = [_references(probe) for probe in probes][0]
    unreferenced = [pg for pg in candidates if _references(pg) - own - _registry_holds(pg, registry) <= 0]
    return unreferenced, len(unreferenced) == len(candidates)


def can_register_tensors(device_type="cuda", group=None):
    """Whether the group's comm backend for `device_type` can register memory
    (NCCL can; Gloo and UCX cannot)."""
    return _comms_backend(group, "can_register_tensors").can_register(device_type)


def register_tensor(tensor, group=None):
    """Registers `tensor`'s memory with the group's comm backend for its
    device (NCCL: ncclCommRegister), so ops on it take the zero-copy paths.
    Returns a handle (deregister(), or a with-block); the group's destroy,
    offload and reload release it. Raises comms.Error(code='unsupported')
    where the backend cannot register. torch has no such call on its own
    process groups, so this is comms.torch's."""
    return _comms_backend(group, "register_tensor").register_tensor(tensor)


def empty(shape, dtype=None, group=None):
    """An uninitialised CPU tensor of `shape` in memory from the group's comm
    (torch's allocate_tensor on its cpu backend): on cpu:ucx memory every rank
    of the host maps, where collectives on tensors that every rank allocated
    so take the zero-copy path. Raises comms.Error(code='unsupported') where
    the backend has no allocator (cpu:gloo; supports_tensor_alloc is False).
    The memory is freed when torch frees the tensor, also after the group was
    destroyed."""
    group = group if group is not None else _c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu")) if hasattr(group, "_get_backend") else group
    if not isinstance(backend, ProcessGroupComms):
        raise ValueError("comms.torch.empty: the group's cpu backend is not 'comms'")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    return backend._allocate_tensor(math.prod(shape), dtype).view(shape)


def _comms_backend(group, call):
    backend = _backend_of(group if group is not None else _c10d._get_default_group())
    if backend is None:
        raise ValueError("comms.torch.%s: the group does not use backend 'comms'" % call)
    return backend


def register_backend():
    """Registers "comms" with torch.distributed (idempotent). torch calls it
    through the entry point group torch.distributed.backends; importing
    comms.torch calls it too."""
    if "COMMS" in getattr(_dist.Backend, "_plugins", {}):
        return
    _dist.Backend.register_backend("comms", _create, extended_api=True, devices=["cpu", "cuda"])


register_backend()

__all__ = ["Options", "ProcessGroupComms", "can_register_tensors", "describe", "destroy_unreferenced_groups", "empty",
           "offload_groups", "register_backend", "register_tensor", "reload_groups"]
