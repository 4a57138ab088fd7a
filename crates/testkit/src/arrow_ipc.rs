//! A minimal Arrow IPC writer (flatbuffer tables laid out by hand, in the
//! layout pyarrow writes) and `datasets`' `save_to_disk` layout: the files
//! brand-import's `import_arrow.rs` and brand-cli's `objects_inputs.rs` pack.

use std::fs;
use std::path::Path;

// ---- a minimal flatbuffer and Arrow IPC writer ----

/// A flatbuffer value: scalars inline, the rest behind an offset.
#[derive(Clone)]
pub enum Val {
    I64(i64),
    I32(i32),
    I16(i16),
    U8(u8),
    Table(Vec<(usize, Val)>),
    Str(String),
    /// A vector of fixed-size structs: their bytes and count.
    Structs(Vec<u8>, u32),
    Tables(Vec<Vec<(usize, Val)>>),
}

/// Writes `fields` as a table; every child follows its parent (offsets
/// point forward). Returns the table's position.
pub fn put_table(buf: &mut Vec<u8>, fields: &[(usize, Val)]) -> usize {
    let slots = fields.iter().map(|(id, _)| id + 1).max().unwrap_or(0);
    let inline_len = |v: &Val| match v {
        Val::I64(_) => 8,
        Val::I32(_) => 4,
        Val::I16(_) => 2,
        Val::U8(_) => 1,
        _ => 4,
    };
    let mut offsets = vec![0u16; slots];
    let mut size = 4;
    for (id, v) in fields {
        offsets[*id] = size as u16;
        size += inline_len(v);
    }
    let vtable = buf.len();
    buf.extend_from_slice(&((4 + 2 * slots) as u16).to_le_bytes());
    buf.extend_from_slice(&(size as u16).to_le_bytes());
    offsets.iter().for_each(|o| buf.extend_from_slice(&o.to_le_bytes()));
    let table = buf.len();
    buf.extend_from_slice(&((table - vtable) as i32).to_le_bytes());
    let mut pending = Vec::new();
    for (_, v) in fields {
        match v {
            Val::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
            Val::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
            Val::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
            Val::U8(x) => buf.push(*x),
            other => {
                pending.push((buf.len(), other.clone()));
                buf.extend_from_slice(&[0; 4]);
            }
        }
    }
    for (slot, v) in pending {
        let target = put_indirect(buf, &v);
        patch(buf, slot, target);
    }
    table
}

pub fn patch(buf: &mut [u8], slot: usize, target: usize) {
    buf[slot..slot + 4].copy_from_slice(&((target - slot) as u32).to_le_bytes());
}

pub fn put_indirect(buf: &mut Vec<u8>, v: &Val) -> usize {
    match v {
        Val::Table(fields) => put_table(buf, fields),
        Val::Str(s) => {
            let at = buf.len();
            buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
            buf.extend_from_slice(s.as_bytes());
            buf.push(0);
            at
        }
        Val::Structs(bytes, n) => {
            let at = buf.len();
            buf.extend_from_slice(&n.to_le_bytes());
            buf.extend_from_slice(bytes);
            at
        }
        Val::Tables(tables) => {
            let at = buf.len();
            buf.extend_from_slice(&(tables.len() as u32).to_le_bytes());
            let slots: Vec<usize> = (0..tables.len()).map(|k| at + 4 + 4 * k).collect();
            buf.extend(std::iter::repeat_n(0, 4 * tables.len()));
            for (slot, t) in slots.into_iter().zip(tables) {
                let target = put_table(buf, t);
                patch(buf, slot, target);
            }
            at
        }
        _ => unreachable!("scalars are inline"),
    }
}

/// A flatbuffer whose root is `fields`.
pub fn flatbuffer(fields: &[(usize, Val)]) -> Vec<u8> {
    let mut buf = vec![0; 4];
    let root = put_table(&mut buf, fields);
    patch(&mut buf, 0, root);
    buf
}

/// One framed IPC message: continuation, length, metadata padded to 8, body.
pub fn framed(header_type: u8, header: Vec<(usize, Val)>, body: &[u8]) -> Vec<u8> {
    let mut meta = flatbuffer(&[
        (0, Val::I16(4)),
        (1, Val::U8(header_type)),
        (2, Val::Table(header)),
        (3, Val::I64(body.len() as i64)),
    ]);
    while !meta.len().is_multiple_of(8) {
        meta.push(0);
    }
    let mut out = vec![0xFF; 4];
    out.extend_from_slice(&(meta.len() as i32).to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(body);
    out
}

pub const EOS: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];

pub fn field(
    name: &str,
    type_type: u8,
    type_fields: Vec<(usize, Val)>,
    children: Vec<Vec<(usize, Val)>>,
) -> Vec<(usize, Val)> {
    vec![
        (0, Val::Str(name.into())),
        (1, Val::U8(1)),
        (2, Val::U8(type_type)),
        (3, Val::Table(type_fields)),
        (5, Val::Tables(children)),
    ]
}

pub fn binary_field(name: &str) -> Vec<(usize, Val)> {
    field(name, 4, vec![], vec![])
}

pub fn string_field(name: &str) -> Vec<(usize, Val)> {
    field(name, 5, vec![], vec![])
}

pub fn int_field(name: &str, bits: i32, signed: bool) -> Vec<(usize, Val)> {
    field(name, 2, vec![(0, Val::I32(bits)), (1, Val::U8(signed as u8))], vec![])
}

pub fn image_field(name: &str) -> Vec<(usize, Val)> {
    field(name, 13, vec![], vec![binary_field("bytes"), string_field("path")])
}

pub fn schema_message(fields: Vec<Vec<(usize, Val)>>, metadata: Option<String>) -> Vec<u8> {
    let mut schema = vec![(1, Val::Tables(fields))];
    if let Some(m) = metadata {
        schema.push((
            2,
            Val::Tables(vec![vec![(0, Val::Str("huggingface".into())), (1, Val::Str(m))]]),
        ));
    }
    framed(1, schema, &[])
}

/// A record batch body under construction: buffers 8-aligned, field nodes.
#[derive(Default)]
pub struct Body {
    pub bytes: Vec<u8>,
    pub buffers: Vec<(i64, i64)>,
    pub nodes: Vec<(i64, i64)>,
}

impl Body {
    pub fn buffer(&mut self, data: &[u8]) {
        self.buffers.push((self.bytes.len() as i64, data.len() as i64));
        self.bytes.extend_from_slice(data);
        while !self.bytes.len().is_multiple_of(8) {
            self.bytes.push(0);
        }
    }

    /// A node and its validity buffer (empty when nothing is null).
    pub fn node(&mut self, valid: &[bool]) {
        let nulls = valid.iter().filter(|v| !**v).count();
        self.nodes.push((valid.len() as i64, nulls as i64));
        if nulls == 0 {
            self.buffer(&[]);
        } else {
            let mut bits = vec![0u8; valid.len().div_ceil(8)];
            for (i, _) in valid.iter().enumerate().filter(|(_, v)| **v) {
                bits[i / 8] |= 1 << (i % 8);
            }
            self.buffer(&bits);
        }
    }

    pub fn binary(&mut self, values: &[Option<&[u8]>]) {
        self.node(&values.iter().map(Option::is_some).collect::<Vec<_>>());
        let mut offsets = vec![0i32];
        let mut data = Vec::new();
        for v in values {
            data.extend_from_slice(v.unwrap_or(&[]));
            offsets.push(data.len() as i32);
        }
        self.buffer(&offsets.iter().flat_map(|o| o.to_le_bytes()).collect::<Vec<_>>());
        self.buffer(&data);
    }

    pub fn int64(&mut self, values: &[Option<i64>]) {
        self.node(&values.iter().map(Option::is_some).collect::<Vec<_>>());
        self.buffer(
            &values
                .iter()
                .flat_map(|v| v.unwrap_or(0).to_le_bytes())
                .collect::<Vec<_>>(),
        );
    }

    pub fn message(&self, length: usize) -> Vec<u8> {
        let pairs = |v: &[(i64, i64)]| {
            v.iter()
                .flat_map(|(a, b)| [a.to_le_bytes(), b.to_le_bytes()])
                .flatten()
                .collect()
        };
        framed(
            3,
            vec![
                (0, Val::I64(length as i64)),
                (1, Val::Structs(pairs(&self.nodes), self.nodes.len() as u32)),
                (2, Val::Structs(pairs(&self.buffers), self.buffers.len() as u32)),
            ],
            &self.bytes,
        )
    }
}

// ---- datasets' layout ----

pub const NAMES: [&str; 4] = ["cat", "dog", "fish", "owl"];

/// One row: image bytes (None: only a path), label (None: null).
#[derive(Clone)]
pub struct Row {
    pub image: Option<Vec<u8>>,
    pub label: Option<i64>,
}

pub fn image(file: usize, row: usize) -> Vec<u8> {
    let mut v = format!("\u{89}PNG {file}/{row} ").into_bytes();
    v.extend((0..(row * 41 + file * 13) % 2500).map(|b| (b ^ row) as u8));
    v
}

pub fn rows(file: usize, n: usize) -> Vec<Row> {
    (0..n)
        .map(|r| Row {
            image: Some(image(file, r)),
            label: if r % 9 == 4 {
                None
            } else {
                Some(((r + file) % NAMES.len()) as i64)
            },
        })
        .collect()
}

pub fn hf_metadata(names: &[&str]) -> String {
    serde_json::json!({"info": {"features": {
        "caption": {"dtype": "string", "_type": "Value"},
        "image": {"_type": "Image"},
        "label": {"names": names, "_type": "ClassLabel"},
    }}})
    .to_string()
}

/// The schema `datasets` writes for caption/Image/ClassLabel columns (the
/// caption first, so the image's buffers do not start at 0).
pub fn hf_schema(names: Option<&[&str]>) -> Vec<u8> {
    schema_message(
        vec![
            string_field("caption"),
            image_field("image"),
            int_field("label", 64, true),
        ],
        names.map(hf_metadata),
    )
}

/// One record batch of `rows` in the schema of `hf_schema`.
pub fn hf_batch(rows: &[Row]) -> Body {
    let mut body = Body::default();
    let captions: Vec<String> = (0..rows.len()).map(|r| format!("caption {r}")).collect();
    body.binary(&captions.iter().map(|c| Some(c.as_bytes())).collect::<Vec<_>>());
    body.node(&vec![true; rows.len()]);
    body.binary(&rows.iter().map(|r| r.image.as_deref()).collect::<Vec<_>>());
    let paths: Vec<String> = (0..rows.len()).map(|r| format!("photos/{r}.png")).collect();
    body.binary(&paths.iter().map(|p| Some(p.as_bytes())).collect::<Vec<_>>());
    body.int64(&rows.iter().map(|r| r.label).collect::<Vec<_>>());
    body
}

/// The bytes of an IPC stream of `rows`, `batch_rows` per record batch.
pub fn hf_stream(rows: &[Row], batch_rows: usize, names: Option<&[&str]>) -> Vec<u8> {
    let mut out = hf_schema(names);
    for chunk in rows.chunks(batch_rows) {
        out.extend(hf_batch(chunk).message(chunk.len()));
    }
    out.extend_from_slice(&EOS);
    out
}

/// The IPC file format around a stream: magic, stream, footer, magic (the
/// footer's content is not read).
pub fn file_format(stream: &[u8]) -> Vec<u8> {
    let mut out = b"ARROW1\0\0".to_vec();
    out.extend_from_slice(stream);
    let footer = flatbuffer(&[(0, Val::I16(4))]);
    out.extend_from_slice(&footer);
    out.extend_from_slice(&(footer.len() as i32).to_le_bytes());
    out.extend_from_slice(b"ARROW1");
    out
}

/// A `save_to_disk` directory of `files` (rows per file), listed in
/// state.json in the given order; names in the schema or dataset_info.json.
pub fn save_to_disk(dir: &Path, files: &[(&str, Vec<Row>)], names_in_schema: bool) {
    fs::create_dir_all(dir).unwrap();
    for (name, rows) in files {
        let names = names_in_schema.then_some(&NAMES[..]);
        fs::write(dir.join(name), hf_stream(rows, 7, names)).unwrap();
    }
    let data_files: Vec<_> = files.iter().map(|(n, _)| serde_json::json!({"filename": n})).collect();
    fs::write(
        dir.join("state.json"),
        serde_json::json!({"_data_files": data_files, "_fingerprint": "f", "_split": "train"}).to_string(),
    )
    .unwrap();
    fs::write(
        dir.join("dataset_info.json"),
        serde_json::json!({"features": {
            "image": {"_type": "Image"},
            "label": {"names": NAMES, "_type": "ClassLabel"},
        }})
        .to_string(),
    )
    .unwrap();
}
