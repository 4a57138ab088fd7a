//! Shared by the import tests: encoding what the importers read.

/// `v` as a protobuf base-128 varint (LSB group first), as Caffe `Datum`s
/// and `tf.train.Example`s encode numbers.
pub fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}
