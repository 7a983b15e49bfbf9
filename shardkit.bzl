"""Build definitions shared by every shardkit package: copts live here only."""

# Warnings are errors for our own code. System headers (-isystem) are exempt.
SK_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
    "-Wno-missing-field-initializers",
]

def sk_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = SK_COPTS + copts, **kwargs)

def sk_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = SK_COPTS + copts, **kwargs)

def sk_cc_test(name, copts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest test linked with gtest_main. Small (60 s) unless it says otherwise."""
    native.cc_test(
        name = name,
        size = size,
        copts = SK_COPTS + copts,
        deps = deps + ["//third_party:gtest_main"],
        **kwargs
    )
