//! A safe wrapper over the parts of include/vllm.h this example uses: an `Engine` and
//! streamed `Request`s, each freed by `Drop`. Errors carry the status name and message.

use std::ffi::{c_char, c_void, CStr, CString};
use std::fmt;
use std::ptr;

#[allow(non_camel_case_types)]
mod sys {
    use std::ffi::{c_char, c_void};

    pub type vllm_status = i32;
    pub const VLLM_OK: vllm_status = 0;
    pub const VLLM_END_OF_STREAM: vllm_status = 11;

    #[repr(C)]
    pub struct vllm_engine {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct vllm_request {
        _private: [u8; 0],
    }

    #[repr(C)]
    pub struct vllm_engine_params {
        pub struct_size: u32,
        pub max_model_len: i32,
        pub device: *const c_char,
        pub dtype: *const c_char,
        pub max_num_seqs: i32,
        pub max_num_batched_tokens: i32,
        pub block_size: i32,
        pub enable_prefix_caching: i32,
        pub kv_cache_memory_bytes: i64,
        pub seed: i64,
        pub enable_chunked_prefill: i32,
        pub enforce_eager: i32,
        pub served_model_name: *const c_char,
        pub chat_template: *const c_char,
        pub progress_callback: Option<extern "C" fn(f32, *mut c_void) -> i32>,
        pub progress_callback_user_data: *mut c_void,
        pub tokenizer: *const c_char,
        pub structured_outputs_backend: *const c_char,
        pub reasoning_parser: *const c_char,
        pub tool_call_parser: *const c_char,
        pub enable_auto_tool_choice: i32,
        pub load_format: *const c_char,
        pub gpu_memory_utilization: f32,
        pub skip_tokenizer_init: i32,
        pub async_scheduling: i32, // since 0.4
        pub n_threads: i32,        // since 0.5
        pub multiprocessing: i32,  // since 0.5
        pub tensor_parallel_size: i32, // since 1.0
        pub tool_strict_level: *const c_char, // since 1.1
        pub reasoning_start_str: *const c_char, // since 1.2
        pub reasoning_end_str: *const c_char, // since 1.2
        pub quantization: *const c_char,        // since 1.3
        pub kv_cache_dtype: *const c_char,      // since 1.3
        pub mamba_cache_dtype: *const c_char,   // since 1.3
        pub mamba_ssm_cache_dtype: *const c_char, // since 1.3
        pub mamba_cache_mode: *const c_char,    // since 1.3
        pub calculate_kv_scales: i32,           // since 1.3
        pub runner: *const c_char,              // since 1.3
        pub convert: *const c_char,             // since 1.3
        pub pooler_config: *const c_char,       // since 1.3
    }

    #[repr(C)]
    pub struct vllm_sampling_params {
        pub struct_size: u32,
        pub max_tokens: i32,
        pub temperature: f32,
        pub top_p: f32,
        pub top_k: i32,
        pub min_p: f32,
        pub seed: i64,
        pub has_seed: i32,
        pub ignore_eos: i32,
        pub stop_token_ids: *const i32,
        pub n_stop_token_ids: usize,
        pub skip_special_tokens: i32,
        pub presence_penalty: f32,
        pub frequency_penalty: f32,
        pub repetition_penalty: f32,
        pub min_tokens: i32,
        pub stop: *const *const c_char,
        pub n_stop: usize,
        pub include_stop_str_in_output: i32,
        pub logit_bias_token_ids: *const i32,
        pub logit_bias_values: *const f32,
        pub n_logit_bias: usize,
        pub allowed_token_ids: *const i32,
        pub n_allowed_token_ids: usize,
        pub bad_words: *const *const c_char,
        pub n_bad_words: usize,
        pub json_schema: *const c_char,
        pub json_object: i32,
        pub regex: *const c_char,
        pub choice: *const *const c_char,
        pub n_choice: usize,
        pub grammar: *const c_char,
        pub structural_tag: *const c_char,
        pub logprobs: i32, // since 1.0
        pub n: i32,        // since 1.0
        pub repetition_max_pattern_size: i32, // since 1.2
        pub repetition_min_pattern_size: i32, // since 1.2
        pub repetition_min_count: i32,        // since 1.2
        pub thinking_token_budget: i32,       // since 1.2
        pub logprob_token_ids: *const i32,    // since 1.2
        pub n_logprob_token_ids: usize,       // since 1.2
        pub use_generation_config: i32,       // since 1.3
    }

    #[repr(C)]
    pub struct vllm_event {
        pub struct_size: u32,
        pub finished: i32,
        pub request_id: *const c_char,
        pub token_ids: *const i32,
        pub n_token_ids: usize,
        pub text: *const c_char,
        pub finish_reason: i32,
        pub num_prompt_tokens: i32,
        pub num_output_tokens: i32,
        pub num_cached_tokens: i32,
        pub status: vllm_status,
        pub error: *const c_char,
        pub index: i32, // since 1.0
        pub logprobs: *const c_void,
        pub arrival_time: f64,
        pub first_token_latency: f64,
        pub e2e_latency: f64,
    }

    pub type vllm_event_callback = Option<extern "C" fn(*const vllm_event, *mut c_void)>;

    extern "C" {
        pub fn vllm_status_string(status: vllm_status) -> *const c_char;
        pub fn vllm_last_error() -> *const c_char;
        pub fn vllm_shutdown();
        pub fn vllm_engine_params_init(params: *mut vllm_engine_params, size: usize);
        pub fn vllm_engine_create(
            model_path: *const c_char,
            params: *const vllm_engine_params,
            out: *mut *mut vllm_engine,
        ) -> vllm_status;
        pub fn vllm_engine_free(engine: *mut vllm_engine);
        pub fn vllm_engine_start_loop(engine: *mut vllm_engine) -> vllm_status;
        pub fn vllm_engine_check_health(engine: *mut vllm_engine) -> vllm_status; // since 1.3
        pub fn vllm_sampling_params_init(params: *mut vllm_sampling_params, size: usize);
        pub fn vllm_request_submit(
            engine: *mut vllm_engine,
            request_id: *const c_char,
            prompt: *const c_char,
            prompt_token_ids: *const i32,
            n_prompt_token_ids: usize,
            params: *const vllm_sampling_params,
            callback: vllm_event_callback,
            user_data: *mut c_void,
            out: *mut *mut vllm_request,
        ) -> vllm_status;
        pub fn vllm_request_next(
            request: *mut vllm_request,
            timeout_ms: i32,
            event: *mut *const vllm_event,
        ) -> vllm_status;
        pub fn vllm_request_free(request: *mut vllm_request);
    }
}

/// A failed libvllm call: the status name and the thread's last error message.
#[derive(Debug)]
pub struct Error {
    pub status: i32,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = unsafe { CStr::from_ptr(sys::vllm_status_string(self.status)) };
        write!(f, "{}: {}", name.to_string_lossy(), self.message)
    }
}

fn check(status: sys::vllm_status) -> Result<(), Error> {
    if status == sys::VLLM_OK {
        return Ok(());
    }
    let message = unsafe { CStr::from_ptr(sys::vllm_last_error()) };
    Err(Error {
        status,
        message: message.to_string_lossy().into_owned(),
    })
}

fn c_string(s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error {
        status: 1,
        message: "string contains a NUL".into(),
    })
}

/// Stops the library's runtime; call once before the process exits.
pub fn shutdown() {
    unsafe { sys::vllm_shutdown() }
}

/// A loaded model whose background loop runs; freed (requests aborted) on drop.
pub struct Engine {
    handle: *mut sys::vllm_engine,
}

// The library serializes engine work internally (vllm.h, "Thread safety").
unsafe impl Send for Engine {}
unsafe impl Sync for Engine {}

impl Engine {
    pub fn new(model_path: &str, max_model_len: i32) -> Result<Engine, Error> {
        let path = c_string(model_path)?;
        let mut handle = ptr::null_mut();
        unsafe {
            let mut params = std::mem::zeroed::<sys::vllm_engine_params>();
            sys::vllm_engine_params_init(&mut params, std::mem::size_of::<sys::vllm_engine_params>());
            params.max_model_len = max_model_len;
            check(sys::vllm_engine_create(path.as_ptr(), &params, &mut handle))?;
        }
        let engine = Engine { handle };
        check(unsafe { sys::vllm_engine_start_loop(engine.handle) })?;
        Ok(engine)
    }

    /// Ok while the engine can run; the status VLLM_ERR_ENGINE_DEAD and the reason once
    /// its loop failed or its engine-core process died (since ABI 1.3).
    pub fn check_health(&self) -> Result<(), Error> {
        check(unsafe { sys::vllm_engine_check_health(self.handle) })
    }

    /// Submits a greedy request; its events are read from the returned `Request`.
    pub fn generate(&self, id: &str, prompt: &str, max_tokens: i32) -> Result<Request<'_>, Error> {
        let (id, prompt) = (c_string(id)?, c_string(prompt)?);
        let mut handle = ptr::null_mut();
        unsafe {
            let mut sp = std::mem::zeroed::<sys::vllm_sampling_params>();
            sys::vllm_sampling_params_init(&mut sp, std::mem::size_of::<sys::vllm_sampling_params>());
            sp.temperature = 0.0;
            sp.max_tokens = max_tokens;
            check(sys::vllm_request_submit(
                self.handle,
                id.as_ptr(),
                prompt.as_ptr(),
                ptr::null(),
                0,
                &sp,
                None,
                ptr::null_mut::<c_void>(),
                &mut handle,
            ))?;
        }
        Ok(Request {
            handle,
            _engine: self,
            ended: false,
        })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        unsafe { sys::vllm_engine_free(self.handle) }
    }
}

/// One streamed event, copied out of the library's memory.
#[derive(Debug)]
pub struct Event {
    pub text: String,
    pub token_ids: Vec<i32>,
    pub finished: bool,
    pub finish_reason: i32,
}

/// A streamed request: an iterator of its events. Dropping it early cancels it.
pub struct Request<'e> {
    handle: *mut sys::vllm_request,
    _engine: &'e Engine,
    ended: bool,
}

impl Iterator for Request<'_> {
    type Item = Result<Event, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        let mut event: *const sys::vllm_event = ptr::null();
        let status = unsafe { sys::vllm_request_next(self.handle, -1, &mut event) };
        if status == sys::VLLM_END_OF_STREAM {
            self.ended = true;
            return None;
        }
        if let Err(e) = check(status) {
            self.ended = true;
            return Some(Err(e));
        }
        // The event is valid until the next vllm_request_next: copy what we keep.
        let ev = unsafe { &*event };
        if ev.status != sys::VLLM_OK {
            let message = unsafe { CStr::from_ptr(ev.error) }
                .to_string_lossy()
                .into_owned();
            return Some(Err(Error {
                status: ev.status,
                message,
            }));
        }
        let token_ids = if ev.n_token_ids == 0 {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(ev.token_ids, ev.n_token_ids) }.to_vec()
        };
        let text = unsafe { CStr::from_ptr(ev.text as *const c_char) };
        Some(Ok(Event {
            text: text.to_string_lossy().into_owned(),
            token_ids,
            finished: ev.finished != 0,
            finish_reason: ev.finish_reason,
        }))
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        unsafe { sys::vllm_request_free(self.handle) } // cancels it if unfinished
    }
}
