//! The guest's one door to its host: the import `host.call(ptr, len, out_ptr_ptr, out_len_ptr)
//! -> i32`, which the guest's built-in module `_host` exposes as `call(frame: bytes) -> bytes`
//! (docs/architecture.md §5.4). The host reads the request from the guest's linear memory,
//! answers it through a [`Door`], allocates the answer with the guest's `host_alloc`, and
//! writes its address and length (little-endian `u32`) at the two out-pointers.
//!
//! Everything read here comes from the guest, so it is hostile: every address and length is
//! checked against the guest's memory and [`MAX_REQUEST_BYTES`] before it is read.

use wasmtime::{Caller, Extern, Linker, Memory};

/// The largest request the guest may pass through the door, in bytes: a batch of output lines
/// or a host call's message, far below it.
pub const MAX_REQUEST_BYTES: usize = 64 << 20;

/// The door's status: answered.
const ANSWERED: i32 = 0;
/// The door's status: no host behind it (the guest's `_host.call` raises).
const NO_HOST: i32 = -1;
/// The door's status: the request or its answer could not cross (the guest raises).
const FAULT: i32 = -2;

/// What the door reaches: answers one request of the guest.
pub trait Door: Send {
    /// The answer to `request`, or `None` when it cannot be answered (the guest's call raises).
    fn call(&mut self, request: &[u8]) -> Option<Vec<u8>>;
}

/// Where a store's data keeps its door (none: the guest's call answers "no host").
pub type DoorOf<T> = fn(&mut T) -> &mut Option<Box<dyn Door>>;

/// Defines `host.call` in `linker`, answered by the door `door_of` finds in the store's data.
///
/// Errors: wasmtime's, when the name is defined twice.
pub(super) fn link<T: 'static>(linker: &mut Linker<T>, door_of: DoorOf<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "host",
        "call",
        move |caller: Caller<'_, T>, ptr: i32, len: i32, out_ptr_ptr: i32, out_len_ptr: i32| {
            call(caller, door_of, [ptr, len, out_ptr_ptr, out_len_ptr])
        },
    )?;
    Ok(())
}

/// The import itself: the request's address and length, and where to write the answer's
/// (`[ptr, len, out_ptr_ptr, out_len_ptr]`, as the guest passed them).
fn call<T>(mut caller: Caller<'_, T>, door_of: DoorOf<T>, args: [i32; 4]) -> i32 {
    let [ptr, len, out_ptr_ptr, out_len_ptr] = args;
    let Some(request) = read_request(&mut caller, ptr, len) else {
        return FAULT;
    };
    let Some(mut door) = door_of(caller.data_mut()).take() else {
        return NO_HOST;
    };
    let answer = door.call(&request);
    *door_of(caller.data_mut()) = Some(door);
    match answer {
        Some(answer) => write_answer(&mut caller, &answer, out_ptr_ptr, out_len_ptr),
        None => FAULT,
    }
}

/// Guest addresses and lengths are `i32` in the guest's signatures and `u32` in the guest.
pub(super) fn guest_usize(value: i32) -> usize {
    value as u32 as usize
}

/// The guest's linear memory, as the caller's instance exports it.
fn guest_memory<T>(caller: &mut Caller<'_, T>) -> Option<Memory> {
    match caller.get_export("memory") {
        Some(Extern::Memory(memory)) => Some(memory),
        _ => None,
    }
}

/// The request's bytes, when its range lies in the guest's memory and within the bound.
fn read_request<T>(caller: &mut Caller<'_, T>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let len = guest_usize(len);
    if len > MAX_REQUEST_BYTES {
        return None;
    }
    let memory = guest_memory(caller)?;
    let mut bytes = vec![0; len];
    memory.read(&*caller, guest_usize(ptr), &mut bytes).ok()?;
    Some(bytes)
}

/// Allocates `answer` in the guest with its `host_alloc`, copies it there, and writes its
/// address and length at the out-pointers: [`ANSWERED`], or [`FAULT`] when any step fails.
fn write_answer<T>(
    caller: &mut Caller<'_, T>,
    answer: &[u8],
    out_ptr_ptr: i32,
    out_len_ptr: i32,
) -> i32 {
    let Ok(len) = i32::try_from(answer.len()) else {
        return FAULT;
    };
    let alloc = match caller.get_export("host_alloc").and_then(Extern::into_func) {
        Some(f) => f.typed::<i32, i32>(&*caller).ok(),
        None => None,
    };
    let Some(alloc) = alloc else { return FAULT };
    let Ok(at) = alloc.call(&mut *caller, len) else {
        return FAULT;
    };
    let Some(memory) = guest_memory(caller) else {
        return FAULT;
    };
    let written = memory
        .write(&mut *caller, guest_usize(at), answer)
        .and_then(|()| {
            memory.write(
                &mut *caller,
                guest_usize(out_ptr_ptr),
                &(at as u32).to_le_bytes(),
            )
        })
        .and_then(|()| {
            memory.write(
                &mut *caller,
                guest_usize(out_len_ptr),
                &(len as u32).to_le_bytes(),
            )
        });
    match written {
        Ok(()) => ANSWERED,
        Err(_) => FAULT,
    }
}
