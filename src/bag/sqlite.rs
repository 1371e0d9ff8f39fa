//! rosbag2 sqlite3 storage (`.db3`): tables `topics(id, name, type, serialization_format,
//! offered_qos_profiles, ...)` and `messages(id, topic_id, timestamp, data)`. Messages are read in
//! `(timestamp, id)` order, a page of [`PAGE`] rows per query, so memory stays bounded.
//!
//! A damaged file (a cut tail, a bad page) makes those queries fail part way. The reader then
//! goes row by row: it lists the `(timestamp, id)` keys sqlite can still walk to (the table's
//! b-tree forwards until the damage, and backwards from its end), reads each row on its own, and
//! says once what it skipped and how many rows it recovered of how many the index promised.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::{BagError, BagMessage, TopicInfo};

pub(crate) const MAGIC: &[u8; 16] = b"SQLite format 3\0";
const PAGE: i64 = 16;

fn sql_err(path: &Path, source: rusqlite::Error) -> BagError {
    BagError::Sqlite { path: path.to_path_buf(), source }
}

fn connect(path: &Path) -> Result<Connection, BagError> {
    if !path.exists() {
        return Err(BagError::NotFound { path: path.to_path_buf() });
    }
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| sql_err(path, e))
}

struct SqlTopic {
    name: String,
    type_name: String,
    format: String,
    qos: String,
}

fn read_topics(path: &Path, conn: &Connection) -> Result<Vec<(i64, SqlTopic)>, BagError> {
    // offered_qos_profiles exists since Foxy; older bags lack it.
    let with_qos = "SELECT id, name, type, serialization_format, offered_qos_profiles FROM topics ORDER BY id";
    let without = "SELECT id, name, type, serialization_format, '' FROM topics ORDER BY id";
    let mut stmt = match conn.prepare(with_qos) {
        Ok(s) => s,
        Err(_) => conn.prepare(without).map_err(|e| sql_err(path, e))?,
    };
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                SqlTopic {
                    name: r.get(1)?,
                    type_name: r.get(2)?,
                    format: r.get(3)?,
                    qos: r.get::<_, Option<String>>(4)?.unwrap_or_default(),
                },
            ))
        })
        .map_err(|e| sql_err(path, e))?;
    rows.collect::<Result<Vec<_>, _>>().map_err(|e| sql_err(path, e))
}

/// The `(timestamp, id, topic_id)` keys of the rows sqlite can still reach in a damaged file: the
/// rowid b-tree walked forwards until the first error and backwards from its end until the first
/// error (which reaches the rows past a bad page), in `(timestamp, id)` order.
fn reachable_keys(conn: &Connection) -> (Vec<(i64, i64, i64)>, Option<rusqlite::Error>) {
    let mut keys = std::collections::BTreeSet::new();
    let mut first_error = None;
    for order in ["ASC", "DESC"] {
        let sql = format!("SELECT timestamp, id, topic_id FROM messages ORDER BY id {order}");
        let mut stmt = match conn.prepare(&sql) {
            Ok(s) => s,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        let mut rows = match stmt.query([]) {
            Ok(r) => r,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        loop {
            match rows.next() {
                Ok(Some(r)) => match (r.get(0), r.get(1), r.get(2)) {
                    (Ok(t), Ok(i), Ok(topic)) => {
                        keys.insert((t, i, topic));
                    }
                    _ => continue,
                },
                Ok(None) => break,
                Err(e) => {
                    first_error.get_or_insert(e);
                    break;
                }
            }
        }
    }
    (keys.into_iter().collect(), first_error)
}

/// Topics of one `.db3` file with their message counts.
pub(crate) fn scan_topics(path: &Path) -> Result<Vec<TopicInfo>, BagError> {
    let conn = connect(path)?;
    let topics = read_topics(path, &conn)?;
    let counted = (|| -> rusqlite::Result<HashMap<i64, u64>> {
        let mut stmt = conn.prepare("SELECT topic_id, COUNT(*) FROM messages GROUP BY topic_id")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? as u64)))?;
        rows.collect()
    })();
    // A damaged table: count the rows that can still be reached.
    let counts = counted.unwrap_or_else(|_| {
        let mut counts = HashMap::new();
        for (_, _, topic) in reachable_keys(&conn).0 {
            *counts.entry(topic).or_insert(0) += 1;
        }
        counts
    });
    Ok(topics
        .into_iter()
        .map(|(id, t)| TopicInfo {
            name: t.name,
            type_name: t.type_name,
            serialization_format: t.format,
            message_count: counts.get(&id).copied().unwrap_or(0),
            offered_qos_profiles: t.qos,
        })
        .collect())
}

/// Messages of one `.db3` file in `(timestamp, id)` order.
pub(crate) struct SqliteMessages {
    path: PathBuf,
    conn: Connection,
    /// topic id -> (name, type) of the topics passing the filter.
    topics: HashMap<i64, (String, String)>,
    /// `topic_id IN (...)` clause, empty without a filter.
    topic_clause: String,
    cursor: (i64, i64),
    page: VecDeque<BagMessage>,
    exhausted: bool,
    done: bool,
    /// Row-by-row reading of a damaged file: the keys still to read (see [`reachable_keys`]).
    recovery: Option<VecDeque<(i64, i64, i64)>>,
    /// Rows listed but unreadable, in recovery.
    unreadable: u64,
}

impl SqliteMessages {
    pub(crate) fn open(path: &Path, filter: Option<&str>) -> Result<Self, BagError> {
        let conn = connect(path)?;
        let all = read_topics(path, &conn)?;
        let topics: HashMap<i64, (String, String)> = all
            .into_iter()
            .filter(|(_, t)| filter.is_none_or(|f| f == t.name))
            .map(|(id, t)| (id, (t.name, t.type_name)))
            .collect();
        let topic_clause = match filter {
            None => String::new(),
            Some(_) => {
                let ids: Vec<String> = topics.keys().map(i64::to_string).collect();
                format!(" AND topic_id IN ({})", ids.join(","))
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            conn,
            topics,
            topic_clause,
            cursor: (i64::MIN, i64::MIN),
            page: VecDeque::new(),
            exhausted: false,
            done: false,
            recovery: None,
            unreadable: 0,
        })
    }

    /// Switches to row-by-row reading after `error`; returns the one line that says so.
    fn start_recovery(&mut self, error: &rusqlite::Error) -> BagError {
        let (keys, _) = reachable_keys(&self.conn);
        let promised: Option<i64> = self.conn.query_row("SELECT MAX(id) FROM messages", [], |r| r.get(0)).ok();
        let cursor = self.cursor;
        let left: VecDeque<_> = keys.into_iter().filter(|&(t, i, _)| (t, i) > cursor).collect();
        let what = format!(
            "{error}; reading it row by row from timestamp {}: {} more rows reachable{}",
            if cursor.0 == i64::MIN { "start".to_string() } else { cursor.0.to_string() },
            left.len(),
            promised.map_or(String::new(), |m| format!(" (ids up to {m})"))
        );
        self.recovery = Some(left);
        BagError::Skipped { path: self.path.clone(), storage: "sqlite3", what }
    }

    /// The next readable row in recovery; `None` when none is left.
    fn recover_next(&mut self) -> Option<BagMessage> {
        let keys = self.recovery.as_mut()?;
        while let Some((timestamp, id, topic_id)) = keys.pop_front() {
            let Some((topic, type_name)) = self.topics.get(&topic_id) else { continue };
            match self.conn.query_row("SELECT data FROM messages WHERE id = ?1", [id], |r| r.get::<_, Vec<u8>>(0)) {
                Ok(data) => {
                    self.cursor = (timestamp, id);
                    return Some(BagMessage {
                        topic: topic.clone(),
                        type_name: type_name.clone(),
                        log_time_ns: timestamp.max(0) as u64,
                        data,
                    });
                }
                Err(_) => self.unreadable += 1,
            }
        }
        None
    }

    fn fetch(&mut self) -> Result<(), BagError> {
        let sql = format!(
            "SELECT id, topic_id, timestamp, data FROM messages \
             WHERE (timestamp > ?1 OR (timestamp = ?1 AND id > ?2)){} \
             ORDER BY timestamp, id LIMIT {PAGE}",
            self.topic_clause
        );
        let path = &self.path;
        let mut stmt = self.conn.prepare_cached(&sql).map_err(|e| sql_err(path, e))?;
        let mut rows = stmt.query(rusqlite::params![self.cursor.0, self.cursor.1]).map_err(|e| sql_err(path, e))?;
        let mut n = 0;
        while let Some(row) = rows.next().map_err(|e| sql_err(path, e))? {
            n += 1;
            let id: i64 = row.get(0).map_err(|e| sql_err(path, e))?;
            let topic_id: i64 = row.get(1).map_err(|e| sql_err(path, e))?;
            let timestamp: i64 = row.get(2).map_err(|e| sql_err(path, e))?;
            let data: Vec<u8> = row.get(3).map_err(|e| sql_err(path, e))?;
            self.cursor = (timestamp, id);
            let Some((topic, type_name)) = self.topics.get(&topic_id) else {
                if self.topic_clause.is_empty() {
                    return Err(BagError::Corrupt {
                        path: path.clone(),
                        storage: "sqlite3",
                        offset: 0,
                        size: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
                        reason: format!("message id {id} refers to unknown topic id {topic_id}"),
                    });
                }
                continue;
            };
            self.page.push_back(BagMessage {
                topic: topic.clone(),
                type_name: type_name.clone(),
                log_time_ns: timestamp.max(0) as u64,
                data,
            });
        }
        if n < PAGE {
            self.exhausted = true;
        }
        Ok(())
    }

    /// The next message; a damaged file yields one [`BagError::Skipped`] (not the end) and then
    /// the rows that can still be read, and at the end one more `Skipped` if some could not.
    pub(crate) fn next_message(&mut self) -> Option<Result<BagMessage, BagError>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(m) = self.page.pop_front() {
                return Some(Ok(m));
            }
            if self.recovery.is_some() {
                if let Some(m) = self.recover_next() {
                    return Some(Ok(m));
                }
                self.done = true;
                if self.unreadable == 0 {
                    return None;
                }
                let what = format!("{} listed rows could not be read and were skipped", self.unreadable);
                return Some(Err(BagError::Skipped { path: self.path.clone(), storage: "sqlite3", what }));
            }
            if self.exhausted || self.topics.is_empty() {
                self.done = true;
                return None;
            }
            match self.fetch() {
                Ok(()) => {}
                Err(BagError::Sqlite { source, .. }) => {
                    let line = self.start_recovery(&source);
                    return Some(Err(line));
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
