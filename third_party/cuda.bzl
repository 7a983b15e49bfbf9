"""A small cuda_library for Bazel 4, which has no CUDA rules offline.

nvcc compiles each .cu file to a position-independent object; the objects and
the headers become an ordinary cc_library, so C++ targets depend on it as on
any other. Only built under --config=cuda (see //third_party:cuda_enabled);
without it a cuda_library is an empty library and the code that uses it takes
its CPU-only path.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

def _nvcc_objects_impl(ctx):
    headers = []
    includes = []
    quote_includes = []
    for dep in ctx.attr.deps:
        if CcInfo in dep:
            cc = dep[CcInfo].compilation_context
            headers.append(cc.headers)
            includes.extend(cc.includes.to_list() + cc.system_includes.to_list())
            quote_includes.extend(cc.quote_includes.to_list())
    header_set = depset(ctx.files.hdrs, transitive = headers)
    outs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("_nvcc/%s/%s.o" % (ctx.label.name, src.basename))
        args = ctx.actions.args()
        args.add("-c", src)
        args.add("-o", out)
        # -fmad=false: no product and sum are fused into an FMA where the host
        # compiler (baseline x86-64, no FMA) rounds them apart, so the
        # SK_HOST_DEVICE arithmetic gives the CPU's bits on the GPU too.
        args.add_all(["-std=c++20", "-O3", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
                      "-fmad=false"])
        args.add_all(["-I.", "-I" + ctx.bin_dir.path, "-isystem", "/usr/local/cuda/include"])
        args.add_all(["-I" + i for i in includes + quote_includes])
        args.add_all(["-gencode=arch=compute_%s,code=sm_%s" % (a, a) for a in ctx.attr.archs])
        args.add_all(["-D" + d for d in ctx.attr.defines])
        ctx.actions.run(
            executable = NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [header_set]),
            outputs = [out],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
            execution_requirements = {"no-sandbox": "1"},
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(),
        "archs": attr.string_list(),
        "defines": attr.string_list(),
    },
)

# Hopper (H100/H200) and Ampere (A100), the GPUs the paper's numbers come from.
DEFAULT_ARCHS = ["80", "90"]

# private_hdrs: headers only the .cu files include (nvcc sees them; they are
# not part of the library's interface).
def cuda_library(name, srcs, hdrs = [], private_hdrs = [], deps = [], archs = DEFAULT_ARCHS,
                 defines = [], **kwargs):
    _nvcc_objects(
        name = name + "_objs",
        srcs = srcs,
        hdrs = hdrs + private_hdrs,
        deps = deps,
        archs = archs,
        defines = defines,
        tags = ["manual"],
    )
    native.cc_library(
        name = name,
        hdrs = hdrs,
        srcs = select({
            "//third_party:cuda_enabled": [":" + name + "_objs"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//third_party:cuda_enabled": ["@local_cuda//:cudart"],
            "//conditions:default": [],
        }),
        **kwargs
    )
