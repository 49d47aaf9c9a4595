"""comms.dist: process groups as torch.distributed and Megatron's parallel_state use them.

COMMS_ROUTE (direct or split) chooses how groups are created; every group keeps
its creation spec, so offload_groups()/reload_groups() recreate it exactly.
"""
from ._comms import dist as _dist

Group = _dist.Group
init_process_group = _dist.init_process_group
is_initialized = _dist.is_initialized
world = _dist.world
new_group = _dist.new_group
split_group = _dist.split_group
destroy_process_group = _dist.destroy_process_group
groups = _dist.groups
route_from_environment = _dist.route_from_environment
to_hints = _dist.to_hints
option_spellings = _dist.option_spellings
offload_groups = _dist.offload_groups
reload_groups = _dist.reload_groups
shutdown = _dist.shutdown
recover = _dist.recover
admit = _dist.admit
join_process_group = _dist.join_process_group


def _forward_to_comm(group, name):
    # group.all_reduce(...) is group.comm.all_reduce(...), as Group's -> in C++.
    if name.startswith("__"):
        raise AttributeError(name)
    if not group:
        raise AttributeError("%r: this rank is not a member, so the group has no %s" % (group, name))
    return getattr(group.comm, name)


Group.__getattr__ = _forward_to_comm

__all__ = ["Group", "init_process_group", "is_initialized", "world", "new_group", "split_group",
           "destroy_process_group", "groups", "route_from_environment", "to_hints", "option_spellings",
           "offload_groups", "reload_groups", "shutdown", "recover", "admit", "join_process_group"]
