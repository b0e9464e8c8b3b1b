//! Locking that survives a poisoned lock, for the whole workspace.
//!
//! Every lock taken through these functions must guard state that a panic cannot
//! leave half-changed in a way that matters (a map insert, a few field writes, an
//! `Option` taken or put back, a pointer swapped). Then one request or task that
//! panicked while holding it need not turn every later one into a panic too, and
//! these take the guard of a poisoned lock as they would a healthy one's. State
//! that a panic can leave inconsistent needs its own recovery instead.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `mutex`'s guard, poisoned or not.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A read guard of `lock`, poisoned or not.
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// A write guard of `lock`, poisoned or not.
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// What `lock` holds, once nothing else can take it, poisoned or not.
pub fn into_inner<T>(lock: RwLock<T>) -> T {
    lock.into_inner().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_guard() {
        let mutex = Mutex::new(1);
        let rwlock = RwLock::new(1);
        let _ = std::panic::catch_unwind(|| {
            let _mutex = mutex.lock();
            let _rwlock = rwlock.write();
            panic!("poison both");
        });
        assert!(mutex.is_poisoned() && rwlock.is_poisoned());
        *lock(&mutex) += 1;
        *write(&rwlock) += 1;
        assert_eq!((*lock(&mutex), *read(&rwlock)), (2, 2));
        assert_eq!(into_inner(rwlock), 2);
    }
}
