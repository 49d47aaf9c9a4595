// The library needsabsent-plugin.so links, so that the plugin has a
// dependency to lose: the test's copy of the plugin names it
// libcomms_test_absenX.so, which no folder has.
extern "C" __attribute__((visibility("default"))) int comms_test_absent_marker() { return 1; }
