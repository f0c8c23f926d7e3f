// Test plugin: a schema whose default lies outside its own range, which the loader must
// refuse by name when the plugin loads (not when a run first meets the value). Its
// functions are never called.
#include <megabatch/plugin.h>

namespace {
const mb_hparam_spec kSchema[] = {{"beta", MB_HPARAM_FLOAT, 2.0, 0.0, 1.0, "momentum, with a default out of range"}};
void* create(const mb_host*, const mb_param*, size_t, const double*, char*, size_t) { return nullptr; }
int step(void*, const mb_step_info*, char*, size_t) { return 1; }
void destroy(void*) {}
}  // namespace

extern "C" __attribute__((visibility("default"))) const mb_plugin_entry megabatch_optimizer_plugin = {
    MB_PLUGIN_ABI_VERSION, MB_DEVICES_CPU, "bad_schema", "0.0.1", "a schema at odds with itself", kSchema, 1,
    create, step, destroy, 0u};
