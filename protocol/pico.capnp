# Messages between pico-coord and pico-worker (and between workers).
#
# Every ZeroMQ message is one Envelope frame (this schema, unpacked Cap'n Proto) and,
# for activations and logits, the payload frames after it: one frame per tensor, raw
# little-endian values of the dtype named in the header. A receiver refuses an
# envelope whose `version` is not kProtocolVersion.
@0xc4f3a8e1b2d6f719;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("pico::protocol::schema");

const protocolVersion :UInt32 = 1;

enum DType {
  f32 @0;
  f16 @1;
  q80 @2;
}

enum ErrorCode {
  malformed @0;        # the envelope could not be read
  wrongVersion @1;
  badRequest @2;       # a well-formed message the receiver cannot serve (wrong stage, bad shape)
  forwardFailed @3;    # the engine threw
  unavailable @4;      # a worker further down is gone
  internal @5;
}

struct ModelIdentity {
  hash @0 :UInt64;     # FNV-1a over the GGUF metadata, tensor table and a prefix of each tensor
  arch @1 :Text;
  nLayer @2 :UInt32;
  nEmbd @3 :UInt32;
  nVocab @4 :UInt32;
}

struct Hello {
  role @0 :Text;       # "coordinator" or "worker"
}

struct Capabilities {
  isa @0 :Text;              # cpu level in use: scalar, avx2, avx512, neon ...
  cores @1 :UInt32;
  threads @2 :UInt32;
  memoryBytes @3 :UInt64;    # physical memory of the host
  backend @4 :Text;
  firstLayer @5 :UInt32;     # [firstLayer, lastLayer)
  lastLayer @6 :UInt32;
  model @7 :ModelIdentity;
}

struct Plan {
  next @0 :Text;             # address of the next stage; empty: this is the last stage
  stageIndex @1 :UInt32;
  stageCount @2 :UInt32;
}

struct SequenceRef {
  seqId @0 :Int32;
}

struct Truncate {
  seqId @0 :Int32;
  pos @1 :Int64;             # keep positions [0, pos)
}

# A batch of tokens for one stage. The payload frame holds tokens x width values
# (hidden states); the stage holding layer 0 gets no payload (width 0) and embeds
# `tokens`.
struct Forward {
  stepId @0 :UInt64;
  seqIds @1 :List(Int32);
  positions @2 :List(Int32);
  tokens @3 :List(Int32);
  wantLogits @4 :List(Bool);
  rows @5 :UInt32;
  width @6 :UInt32;
  dtype @7 :DType;
  outputDtype @8 :DType;     # for hidden states a stage sends on
}

# The last stage's answer: one payload frame of rows x nVocab F32 values, one row per
# token whose wantLogits was set, in batch order.
struct Logits {
  stepId @0 :UInt64;
  seqIds @1 :List(Int32);
  positions @2 :List(Int32);
  rows @3 :UInt32;
  nVocab @4 :UInt32;
}

struct Stats {
  memoryBytes @0 :UInt64;    # resident set of the process
  kvBytes @1 :UInt64;
  sequences @2 :UInt32;
  batches @3 :UInt64;
  tokens @4 :UInt64;
}

struct Error {
  code @0 :ErrorCode;
  text @1 :Text;
  stepId @2 :UInt64;         # the forward step it concerns, 0: none
}

struct Heartbeat {
  sentNanos @0 :UInt64;
}

struct Envelope {
  version @0 :UInt32;
  body :union {
    hello @1 :Hello;
    capabilities @2 :Capabilities;
    plan @3 :Plan;
    planAck @4 :Void;
    open @5 :SequenceRef;
    truncate @6 :Truncate;
    close @7 :SequenceRef;
    forward @8 :Forward;
    logits @9 :Logits;
    statsRequest @10 :Void;
    stats @11 :Stats;
    error @12 :Error;
    heartbeat @13 :Heartbeat;
  }
}
