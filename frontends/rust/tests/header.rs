//! The raw declarations in src/sys.rs against shardkit.h itself: every
//! exported function (name, parameter and return types), every enum
//! constant, and every struct's fields, offsets and size. The header is
//! found through SHARDKIT_HEADER, else at its place in this checkout; the
//! layout asserts that pin every offset (capi/abi_layout.h) through
//! SHARDKIT_LAYOUT, else at theirs.
use std::collections::BTreeMap;
use std::path::PathBuf;

const SYS_RS: &str = include_str!("../src/sys.rs");

fn header_text() -> String {
    let path = match std::env::var_os("SHARDKIT_HEADER") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../capi/include/shardkit/shardkit.h"),
    };
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {}", path.display(), e))
}

fn layout_text() -> String {
    let path = match std::env::var_os("SHARDKIT_LAYOUT") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../capi/abi_layout.h"),
    };
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {}", path.display(), e))
}

fn strip_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        match (block, line) {
            (Some(b), l) if l.map_or(true, |l| b < l) => {
                out.push_str(&rest[..b]);
                let end = rest[b..].find("*/").expect("unterminated comment") + b + 2;
                rest = &rest[end..];
            }
            (_, Some(l)) => {
                out.push_str(&rest[..l]);
                rest = match rest[l..].find('\n') {
                    Some(n) => &rest[l + n..],
                    None => "",
                };
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// Lines that are not preprocessor directives (with continuations).
fn drop_preprocessor(s: &str) -> String {
    let mut out = String::new();
    let mut continued = false;
    for line in s.lines() {
        let directive = continued || line.trim_start().starts_with('#');
        continued = directive && line.trim_end().ends_with('\\');
        if !directive {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn squash(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// A C type ("const char**") as its Rust spelling ("*mut *const c_char").
fn rust_type(c: &str) -> String {
    let stars = c.matches('*').count();
    let words: Vec<&str> = c.split(|ch: char| ch == '*' || ch.is_whitespace()).filter(|w| !w.is_empty()).collect();
    let is_const = words.contains(&"const");
    let base = words.iter().rfind(|w| **w != "const").expect("a type").to_string();
    let base = match base.as_str() {
        "int32_t" | "int" => "i32".to_string(),
        "int64_t" => "i64".to_string(),
        "uint64_t" => "u64".to_string(),
        "size_t" => "usize".to_string(),
        "float" => "f32".to_string(),
        "double" => "f64".to_string(),
        "char" => "c_char".to_string(),
        "void" if stars == 0 => "()".to_string(),
        "void" => "c_void".to_string(),
        other => other.to_string(),
    };
    let mut t = base;
    for level in 0..stars {
        t = if level == 0 && is_const { format!("*const {}", t) } else { format!("*mut {}", t) };
    }
    t
}

/// name -> (return type, [(param name, type)]) from the header.
fn header_functions(h: &str) -> BTreeMap<String, (String, Vec<(String, String)>)> {
    let mut out = BTreeMap::new();
    for stmt in h.split(';') {
        let pos = match stmt.find("SK_EXPORT") {
            Some(p) => p,
            None => continue,
        };
        let decl = stmt[pos..].replace("SK_EXPORT", "").replace("SK_NODISCARD", "");
        let open = decl.find('(').unwrap();
        let close = decl.rfind(')').unwrap();
        let head = decl[..open].trim();
        let name = head.split(|c: char| c.is_whitespace() || c == '*').rfind(|w| !w.is_empty()).unwrap();
        let ret = head[..head.len() - name.len()].trim();
        let params_text = decl[open + 1..close].trim();
        let mut params = Vec::new();
        if params_text != "void" {
            for p in params_text.split(',') {
                let p = p.trim();
                let pname = p.split(|c: char| c.is_whitespace() || c == '*').rfind(|w| !w.is_empty()).unwrap();
                let ptype = p[..p.len() - pname.len()].trim();
                params.push((pname.to_string(), squash(&rust_type(ptype))));
            }
        }
        out.insert(name.to_string(), (squash(&rust_type(ret)), params));
    }
    out
}

/// The same from the `extern "C"` block of sys.rs.
fn rust_functions() -> BTreeMap<String, (String, Vec<(String, String)>)> {
    let start = SYS_RS.find("extern \"C\" {").expect("extern block");
    let block = &SYS_RS[start..];
    let mut out = BTreeMap::new();
    for stmt in block.split(';') {
        let pos = match stmt.find("pub fn ") {
            Some(p) => p,
            None => continue,
        };
        let decl = &stmt[pos + 7..];
        let open = decl.find('(').unwrap();
        let close = decl.rfind(')').unwrap();
        let name = decl[..open].trim().to_string();
        let ret = match decl[close + 1..].find("->") {
            Some(a) => squash(&decl[close + 1 + a + 2..]),
            None => "()".to_string(),
        };
        let mut params = Vec::new();
        for p in decl[open + 1..close].split(',') {
            let p = p.trim();
            if p.is_empty() {
                continue;
            }
            let colon = p.find(':').unwrap();
            let pname = p[..colon].trim().trim_end_matches('_').to_string();
            params.push((pname, squash(&p[colon + 1..])));
        }
        out.insert(name, (ret, params));
    }
    out
}

#[test]
fn every_function_matches_the_header() {
    let h = drop_preprocessor(&strip_comments(&header_text()));
    let header = header_functions(&h);
    let rust = rust_functions();
    assert!(header.len() > 40, "parsed only {} functions from the header", header.len());
    let missing: Vec<&String> = header.keys().filter(|k| !rust.contains_key(*k)).collect();
    let extra: Vec<&String> = rust.keys().filter(|k| !header.contains_key(*k)).collect();
    assert!(missing.is_empty(), "declared in shardkit.h, missing in sys.rs: {:?}", missing);
    assert!(extra.is_empty(), "in sys.rs but not in shardkit.h: {:?}", extra);
    for (name, decl) in &header {
        assert_eq!(&rust[name], decl, "signature of {}", name);
    }
}

#[test]
fn every_enum_constant_matches_the_header() {
    let h = drop_preprocessor(&strip_comments(&header_text()));
    let mut header = BTreeMap::new();
    for body in h.split("typedef SK_ENUM(").skip(1) {
        let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
        for item in body.split(',') {
            let mut kv = item.split('=');
            let (k, v) = (kv.next().unwrap().trim(), kv.next().unwrap().trim());
            header.insert(k.to_string(), v.parse::<i64>().unwrap());
        }
    }
    let mut rust = BTreeMap::new();
    for line in SYS_RS.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("pub const SK_") {
            let name = format!("SK_{}", &rest[..rest.find(':').unwrap()]);
            let value = rest[rest.find('=').unwrap() + 1..].trim_end_matches(';').trim();
            rust.insert(name, value.parse::<i64>().unwrap());
        }
    }
    assert!(header.len() > 30);
    for (k, v) in &header {
        assert_eq!(rust.get(k), Some(v), "enum constant {}", k);
    }
}

macro_rules! layout {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {{
        let mut v: Vec<(String, Vec<(String, usize)>, usize)> = Vec::new();
        $({
            let u = std::mem::MaybeUninit::<shardkit::sys::$ty>::uninit();
            let base = u.as_ptr() as usize;
            let fields = vec![$((stringify!($field).to_string(),
                unsafe { std::ptr::addr_of!((*u.as_ptr()).$field) } as usize - base)),*];
            v.push((stringify!($ty).to_string(), fields, std::mem::size_of::<shardkit::sys::$ty>()));
        })*
        v
    }};
}

#[test]
fn every_struct_has_the_headers_fields_offsets_and_size() {
    let text = header_text();
    let h = drop_preprocessor(&strip_comments(&text));
    let rust = layout! {
        sk_gloo_options { struct_size, rank, world_size, master_addr, master_port, hostname, timeout_ms, check_desync, network_model }
        sk_nccl_options { struct_size, rank, world_size, master_addr, master_port, use_device, device, timeout_ms, skip_call_check }
        sk_fsdp_options { struct_size, strategy, shard_group_size, backward_prefetch, forward_prefetch, all_gather_limit,
                          param_dtype, reduce_dtype, buffer_dtype, cpu_offload, gradient_predivide_factor, seed, timeout_ms,
                          grad_accumulation }
        sk_optimizer_options { struct_size, kind, lr, momentum, dampening, nesterov, beta1, beta2, eps, weight_decay,
                               param_groups, num_param_groups }
        sk_param_group { struct_size, pattern, norms_biases_embeddings, weight_decay, lr_multiplier, inherit_weight_decay,
                         no_decay }
        sk_lr_schedule { struct_size, kind, min_lr, warmup_steps, decay_steps }
        sk_dataset_options { struct_size, paths, num_paths, format, token_file_layout, token_bytes, seed, sequential,
                             packing, eos_id, has_eos_id, num_eval_paths, eval_paths }
        sk_trainer_options { struct_size, model, fsdp, optimizer, batch_size, grad_accum_steps, seq_len, source_len,
                             clip_grad_norm, activation_checkpointing, memory_cap_bytes, data_path, data_token_bytes,
                             data_seed, data_tokens, parallelism, ddp_bucket_bytes, device, lr_schedule, dataset,
                             skip_init, skip_nonfinite_steps, packed_documents }
        sk_device_options { struct_size, kind, use_index, index, sim_profile, sim_world_size, sim_gpus_per_node,
                            launch_blocking }
        sk_step_metrics { struct_size, step, rank, loss, grad_norm, step_seconds, tokens_per_second, model_tflops_per_rank,
                          hardware_tflops_per_rank, peak_allocated_bytes, peak_reserved_bytes, allocated_bytes,
                          reserved_bytes, alloc_retries, ooms, bytes_communicated, global_loss, simulated, lr, skipped,
                          target_tokens, global_target_tokens }
        sk_memory_estimate { struct_size, parameters, master_bytes, grad_shard_bytes, optimizer_bytes,
                             persistent_bytes, unsharded_bytes, activation_bytes, peak_bytes }
        sk_plan_request { struct_size, model, profile, gpus, gpus_per_node, batch_size, seq_len, source_len, strategies,
                          dtypes, activation_checkpointing, cpu_offload, trace_path, checkpointing }
        sk_plan_candidate { struct_size, label, parallelism, strategy, shard_group_size, backward_prefetch,
                            forward_prefetch, rate_limit, activation_checkpointing, cpu_offload, param_dtype,
                            reduce_dtype, fits, out_of_memory, error, peak_allocated_bytes, peak_reserved_bytes,
                            alloc_retries, required_bytes, step_seconds, tflops_per_gpu, mfu, exposed_comm_seconds,
                            peak_host_bytes }
        sk_plan_result { struct_size, profile, device_memory_bytes, num_candidates, recommended, recommendation, table,
                         json }
        sk_param_spec { struct_size, name, ndim, shape, dtype, init, init_a, init_b }
        sk_engine_options { struct_size, fsdp, optimizer, memory_cap_bytes, device, cuda_stream, custom_optimizer,
                            custom_state_names, num_custom_states }
        sk_shard_piece { struct_size, name, param, ndim, shape, shard_offset, numel, param_offset, param_group,
                         weight_decay, lr_multiplier }
        sk_tensor_view { struct_size, data, dtype, ndim, shape, numel }
        sk_batch { struct_size, batch_size, seq_len, input_ids, targets, loss_mask, position_ids, segment_ids }
    };
    // The library's layout asserts: offsetof(T, f) == N, sizeof(T) == N.
    let asserts = squash(&layout_text());
    let mut header_structs = 0;
    for body in h.split("typedef struct").skip(1) {
        let open = match body.find('{') {
            Some(o) => o,
            None => continue,  // an opaque handle
        };
        let name = body[..open].trim().to_string();
        header_structs += 1;
        let fields: Vec<String> = body[open + 1..body.find('}').unwrap()]
            .split(';')
            .map(|d| d.trim())
            .filter(|d| !d.is_empty())
            .map(|d| d.split(|c: char| c.is_whitespace() || c == '*').rfind(|w| !w.is_empty()).unwrap().to_string())
            .collect();
        let (_, rust_fields, rust_size) = rust.iter().find(|(n, _, _)| *n == name)
            .unwrap_or_else(|| panic!("struct {} of shardkit.h is not in the layout check", name));
        let names: Vec<String> = rust_fields.iter().map(|(f, _)| f.clone()).collect();
        assert_eq!(names, fields, "fields of {}", name);
        assert!(asserts.contains(&format!("sizeof({})=={}", name, rust_size)), "sizeof({}) is {} in Rust", name, rust_size);
        for (field, offset) in rust_fields.iter().skip(1) {
            let expected = format!("offsetof({},{})=={}", name, field, offset);
            assert!(asserts.contains(&expected), "{}.{} is at {} in Rust; the header asserts otherwise", name, field, offset);
        }
    }
    assert_eq!(header_structs, rust.len());
}
