//! Per chat, the absolute index of the oldest turn a connection (or a client id) holds: its snapshot and the
//! pages it fetched. A connection holds a few chats at most, and every idle connection keeps one of these, so it
//! is a vector sized to what it holds (a hash map's smallest table, about 160 bytes, was most of a connection's
//! shard state; `scripts/bench idle`).

/// Chat → the absolute index of the oldest turn held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TurnWindows(Vec<(String, usize)>);

impl TurnWindows {
    /// The window of `chat`, if one is held.
    pub fn get(&self, chat: &str) -> Option<&usize> {
        self.0
            .iter()
            .find(|(held, _)| held == chat)
            .map(|(_, first)| first)
    }

    /// Hold `chat` from `first` on (replacing its window).
    pub fn insert(&mut self, chat: String, first: usize) {
        if let Some(slot) = self.0.iter_mut().find(|(held, _)| *held == chat) {
            slot.1 = first;
            return;
        }
        // One more slot, not the vector's usual doubling: most hold one chat for their whole life.
        self.0.reserve_exact(1);
        self.0.push((chat, first));
    }

    /// The window of `chat`, held from `first` on if it was not held yet.
    pub fn get_or_insert(&mut self, chat: &str, first: usize) -> &mut usize {
        let index = match self.0.iter().position(|(held, _)| held == chat) {
            Some(index) => index,
            None => {
                self.insert(chat.to_string(), first);
                self.0.len() - 1
            }
        };
        &mut self.0[index].1
    }

    /// Stop holding `chat`.
    pub fn remove(&mut self, chat: &str) -> Option<usize> {
        let index = self.0.iter().position(|(held, _)| held == chat)?;
        let (_, first) = self.0.swap_remove(index);
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
        Some(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_held_replaced_and_dropped_per_chat() {
        let mut windows = TurnWindows::default();
        assert_eq!(windows.get("a"), None);
        windows.insert("a".into(), 5);
        windows.insert("b".into(), 7);
        windows.insert("a".into(), 3);
        assert_eq!((windows.get("a"), windows.get("b")), (Some(&3), Some(&7)));
        *windows.get_or_insert("b", 100) = 6;
        assert_eq!(*windows.get_or_insert("c", 9), 9);
        assert_eq!(windows.remove("b"), Some(6));
        assert_eq!(windows.remove("b"), None);
        assert_eq!((windows.get("a"), windows.get("c")), (Some(&3), Some(&9)));
    }

    #[test]
    fn one_chat_takes_one_slot() {
        let mut windows = TurnWindows::default();
        windows.insert("ahp-chat:/one".into(), 0);
        assert_eq!(windows.0.capacity(), 1);
    }
}
