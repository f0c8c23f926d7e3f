// Test plugin: a shared library without the entry symbol.
extern "C" {
__attribute__((visibility("default"))) int megabatch_something_else = 1;
}
