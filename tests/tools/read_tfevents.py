#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for the tests: TFRecord framing with
the masked CRC32C of length and data checked by a bitwise CRC written here, and Event /
Summary messages decoded by the protobuf library from a schema built here from
TensorFlow's field numbers (event.proto: wall_time 1, step 2, file_version 3, summary 5;
summary.proto: value 1, tag 1, simple_value 2) -- it shares no code with megabatch.

usage: read_tfevents.py FILE  ->  JSON: {"file_version": ..., "scalars": [[tag, step, value], ...]}
"""
import json
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="tfevents_reader.proto", package="reader", syntax="proto3")
    v = fd.message_type.add(name="Value")
    v.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    v.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    s = fd.message_type.add(name="Summary")
    s.field.add(name="value", number=1, type=F.TYPE_MESSAGE, type_name=".reader.Value", label=F.LABEL_REPEATED)
    e = fd.message_type.add(name="Event")
    e.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    e.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    e.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    e.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, type_name=".reader.Summary", label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    desc = pool.FindMessageTypeByName("reader.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def read(path):
    Event = event_class()
    out = {"file_version": None, "scalars": []}
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        if len(data) - at < 12:
            raise ValueError(f"{path}: torn record header at byte {at}")
        header = data[at:at + 8]
        (n,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if masked(header) != len_crc:
            raise ValueError(f"{path}: length CRC mismatch at byte {at}")
        body = data[at + 12:at + 12 + n]
        (body_crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        if masked(body) != body_crc:
            raise ValueError(f"{path}: data CRC mismatch at byte {at}")
        at += 16 + n
        e = Event()
        e.ParseFromString(body)
        if e.file_version:
            out["file_version"] = e.file_version
        for v in e.summary.value:
            out["scalars"].append([v.tag, e.step, v.simple_value])
    return out


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1])))
