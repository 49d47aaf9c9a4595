// A plugin-shaped module that calls a function defined only with
// -DDEFINE_MISSING. Linked with the plugins' flags, the build without it must
// fail (plugin_link_test.py): an unresolved symbol is a link error, not a
// dlopen failure on a user's machine.
int comms_test_missing_function();
#ifdef DEFINE_MISSING
int comms_test_missing_function() { return 1; }
#endif
extern "C" int comms_test_entry() { return comms_test_missing_function(); }
