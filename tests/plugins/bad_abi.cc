// Test plugin: declares ABI version 999, which the host must refuse by name.
#include <megabatch/plugin.h>

extern "C" __attribute__((visibility("default"))) const mb_plugin_entry megabatch_optimizer_plugin = {
    999u, MB_DEVICES_CPU, "bad_abi", "0.0.1", "declares a future ABI", nullptr, 0, nullptr, nullptr, nullptr, 0u};
