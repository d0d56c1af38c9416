//! nft in this process: libnftables (`libnftables.so.1`, the library the
//! `nft` program is built on), loaded at run time.
//!
//! Starting `nft` costs ~2.7 ms of the ~3.7 ms a one-ban transaction takes
//! (BENCHMARKS.md, "A long list at start"). Small transactions (a new ban)
//! run here instead, on the same parser and the same netlink batch, so the
//! text and the kernel's answer are nft's own. Large ones stay with the
//! program (`nft.rs`): libnftables builds a transaction's objects and a
//! listing's JSON in the caller's heap (hundreds of MB for a million
//! elements), which this long-lived process would keep. So does the
//! table's creation, and the 5 s table check is a netlink request of its
//! own (`netlink.rs`): the library is loaded with the first ban, and an
//! idle daemon never maps it.
//!
//! One context serves the process and is never freed: one is all the
//! daemon needs, and no two contexts then share what libnftables keeps
//! process-wide (older versions kept their name tables in globals that a
//! context's creation and freeing set up and tore down). A context is not
//! thread-safe, so each call holds a lock; it
//! runs on a blocking thread, and its netlink socket belongs to the network
//! namespace the process was in when the context was made.
//!
//! The library is optional: missing, or missing a symbol, the commands go
//! to the program, and `open` says why.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock};

/// The library's file name (the nft package's soname since 0.9.0).
const SONAME: &CStr = c"libnftables.so.1";
/// `NFT_CTX_DEFAULT`: a context with a netlink socket.
const CTX_DEFAULT: u32 = 0;
/// `NFT_CTX_OUTPUT_JSON` (libnftables.h): what `nft -j` sets.
const OUTPUT_JSON: c_uint = 1 << 4;

/// A command of no command: nft asks the kernel's ruleset generation and
/// releases the cache it holds from the call before when that changed
/// (always after our own transaction), as it does for a command that needs
/// none. nft 1.0.6 keeps four 8,192-bucket hash tables (128 KiB each) for
/// every table it cached until its next call: ~0.5 MB of an idle daemon's
/// memory after a ban, rebuilt by the next transaction anyway.
const EMPTY: &CStr = c"";

type Ctx = *mut c_void;

/// The functions used, resolved once.
struct Api {
    new: unsafe extern "C" fn(u32) -> Ctx,
    buffer_output: unsafe extern "C" fn(Ctx) -> c_int,
    buffer_error: unsafe extern "C" fn(Ctx) -> c_int,
    output_buffer: unsafe extern "C" fn(Ctx) -> *const c_char,
    error_buffer: unsafe extern "C" fn(Ctx) -> *const c_char,
    set_output_flags: unsafe extern "C" fn(Ctx, c_uint),
    run: unsafe extern "C" fn(Ctx, *const c_char) -> c_int,
}

/// The process's context, with its output and errors buffered.
pub(super) struct Context {
    api: Api,
    ctx: NonNull<c_void>,
}

// SAFETY: the context is only used under its `Mutex`, one call at a time;
// libnftables keeps no thread-local state.
unsafe impl Send for Context {}

/// What nft said: its output on success, its error text on refusal.
pub(super) type Answer = Result<Vec<u8>, String>;

/// The process's context once made (`shared`).
static SHARED: OnceLock<Result<Mutex<Context>, String>> = OnceLock::new();

/// Whether this process has loaded libnftables (its context is made):
/// the daemon lets go of the code pages the load mapped once.
pub fn loaded() -> bool {
    SHARED.get().is_some_and(Result::is_ok)
}

/// The process's context, made on first use; `Err` says why there is none
/// (the same answer for the life of the process).
pub(super) fn shared() -> Result<&'static Mutex<Context>, &'static str> {
    SHARED
        .get_or_init(|| Context::open().map(Mutex::new))
        .as_ref()
        .map_err(String::as_str)
}

impl Context {
    fn open() -> Result<Context, String> {
        // SAFETY: dlopen/dlsym with NUL-terminated names; the handle is never
        // closed, so the function pointers stay valid for the process.
        unsafe {
            let handle = libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if handle.is_null() {
                return Err(dl_error("cannot load libnftables.so.1"));
            }
            let sym = |name: &CStr| -> Result<*mut c_void, String> {
                let f = libc::dlsym(handle, name.as_ptr());
                if f.is_null() {
                    Err(format!("libnftables.so.1 has no {}", name.to_string_lossy()))
                } else {
                    Ok(f)
                }
            };
            let api = Api {
                new: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(u32) -> Ctx>(sym(c"nft_ctx_new")?),
                buffer_output: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Ctx) -> c_int>(sym(
                    c"nft_ctx_buffer_output",
                )?),
                buffer_error: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Ctx) -> c_int>(sym(
                    c"nft_ctx_buffer_error",
                )?),
                output_buffer: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Ctx) -> *const c_char>(sym(
                    c"nft_ctx_get_output_buffer",
                )?),
                error_buffer: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Ctx) -> *const c_char>(sym(
                    c"nft_ctx_get_error_buffer",
                )?),
                set_output_flags: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Ctx, c_uint)>(sym(
                    c"nft_ctx_output_set_flags",
                )?),
                run: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Ctx, *const c_char) -> c_int>(sym(
                    c"nft_run_cmd_from_buffer",
                )?),
            };
            let ctx = NonNull::new((api.new)(CTX_DEFAULT)).ok_or("nft_ctx_new failed")?;
            if (api.buffer_output)(ctx.as_ptr()) != 0 || (api.buffer_error)(ctx.as_ptr()) != 0 {
                return Err("libnftables cannot buffer its output".to_owned());
            }
            Ok(Context { api, ctx })
        }
    }

    /// Runs `text` as `nft -f -` does (one transaction), or a command such
    /// as `list chains inet`; `json` as `nft -j`.
    pub(super) fn run(&mut self, text: String, json: bool) -> Answer {
        let Ok(text) = CString::new(text) else {
            return Err("the command holds a NUL byte".to_owned());
        };
        let ctx = self.ctx.as_ptr();
        // SAFETY: `ctx` is live and ours alone (the lock); the buffers are
        // the context's, valid until its next call, and copied before it.
        unsafe {
            (self.api.set_output_flags)(ctx, if json { OUTPUT_JSON } else { 0 });
            let rc = (self.api.run)(ctx, text.as_ptr());
            let out = buffer((self.api.output_buffer)(ctx));
            let err = buffer((self.api.error_buffer)(ctx));
            // Lets go of the cache the command built (see `EMPTY`); its
            // answer is of no interest.
            (self.api.run)(ctx, EMPTY.as_ptr());
            if rc == 0 {
                Ok(out)
            } else {
                Err(String::from_utf8_lossy(&err).into_owned())
            }
        }
    }
}

/// A copy of a context buffer (NULL reads as empty).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn buffer(p: *const c_char) -> Vec<u8> {
    if p.is_null() {
        return Vec::new();
    }
    CStr::from_ptr(p).to_bytes().to_vec()
}

/// `what: dlerror()`.
///
/// # Safety
/// As `dlerror`: right after the failed call, on the same thread.
unsafe fn dl_error(what: &str) -> String {
    let e = libc::dlerror();
    if e.is_null() {
        return what.to_owned();
    }
    format!("{what}: {}", CStr::from_ptr(e).to_string_lossy())
}
