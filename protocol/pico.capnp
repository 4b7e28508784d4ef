# Messages between pico-coord and pico-worker (and between workers).
#
# Every ZeroMQ message is one Envelope frame (this schema, unpacked Cap'n Proto) and,
# for activations and logits, the payload frames after it: one frame per tensor, raw
# little-endian values of the dtype named in the header. A receiver refuses an
# envelope whose `version` is not kProtocolVersion.
@0xc4f3a8e1b2d6f719;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("pico::protocol::schema");

# 2: timings in forward/logits, heartbeat echo, snapshot/restore of a sequence.
# 3: per-row logits output (full row or arg max only) in forward/logits.
# 4: greedy chains (plan.chainTo, forward.chainSteps / stopTokens / chained, logits.chained).
# 5: sessions (Envelope.session, Plan.takeOver, Capabilities.session / ownerConnected),
#    the worker's limits (Capabilities.limits), CURVE public keys in plans, busy / limit errors.
# 6: recurrent-state checkpoints (forward.checkpointKeep), hybrid snapshots.
# 7: the worker's profile (Capabilities.profile), bandwidth probes (Heartbeat.probeBytes),
#    layer assignment (assign / assigned: pico-worker --layers auto), link probes between
#    workers (linkProbe / linkMeasured).
# 8: batches of several sizes in the profile (Profile.batches), hidden-state rows
#    (LogitsOutput.hidden, Logits.hidden...: embeddings), slots on disk (slotSave /
#    slotRestore / slotDone).
# 9: per-layer traces of rows (Forward.trace, Forward.layerTraces, Logits.layerTraces:
#    the web UI's activation heatmap).
# 10: the memory a worker has left (Stats.freeBytes: the web UI's cluster page); moving
#     a running `--layers auto` worker to another range (Capabilities.movable, Assign).
const protocolVersion :UInt32 = 10;

enum DType {
  f32 @0;
  f16 @1;
  q80 @2;
}

# What the last stage returns for a row that wants logits.
enum LogitsOutput {
  full @0;             # the row of nVocab F32 logits
  argmax @1;           # its arg max only (token id and logit): all that greedy sampling needs
  hidden @2;           # its hidden state after the output norm (nEmbd F32 values: embeddings)
  meanAdd @3;          # that hidden state added to its sequence's running sum on the last stage; nothing returned
  meanEnd @4;          # added, and the mean of the sequence's rows returned as its hidden state (mean pooling)
}

enum ErrorCode {
  malformed @0;        # the envelope could not be read
  wrongVersion @1;
  badRequest @2;       # a well-formed message the receiver cannot serve (wrong stage, bad shape)
  forwardFailed @3;    # the engine threw
  unavailable @4;      # a worker further down is gone
  internal @5;
  busy @6;             # the worker serves another coordinator's session (see Envelope.session)
  limit @7;            # the message exceeds one of the worker's limits (Limits); the text names it
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

# What a worker can hold, checked before it allocates anything: a forward, a restore or
# a new sequence beyond one of these is refused with ErrorCode.limit. The coordinator
# reads them at connect and sizes its context x parallel sequences to fit every stage.
struct Limits {
  maxRows @0 :UInt32;               # tokens (rows) per forward
  maxPositions @1 :UInt32;          # positions per sequence (the context)
  maxSequences @2 :UInt32;          # sequences holding state at once
  stateBudgetBytes @3 :UInt64;      # bytes of KV + recurrent state this stage may hold in all
  kvBytesPerPosition @4 :UInt64;    # KV bytes one position of one sequence takes on this stage's layers
  stateBytesPerSequence @5 :UInt64; # fixed-size (recurrent) state per sequence; 0 for attention-only layers
  pagePositions @6 :UInt32;         # KV grows in pages of this many positions (budgets count whole pages)
  maxMessageBytes @7 :UInt64;       # the largest message (all frames) the worker accepts
}

# What a worker measured of its hardware with this model (worker/profile.hpp), for the
# coordinator's placement.
struct LayerTime {
  decodeSeconds @0 :Float64;          # one token
  batchSecondsPerToken @1 :Float64;   # per token of a batch of Profile.batch tokens
  secondsPerToken @2 :List(Float64);  # per token of a batch of each of Profile.batches tokens
}
struct Profile {
  batch @0 :UInt32;                  # 0: no profile
  layers @1 :List(LayerTime);        # every layer of the model
  head @2 :LayerTime;                # output norm and head
  memoryBytes @3 :UInt64;            # offered for weights + KV + state
  batches @4 :List(UInt32);          # 2, 4, 8 ... below batch, and batch
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
  session @8 :UInt64;        # the session the worker serves now (0: none)
  ownerConnected @9 :Bool;   # that session's coordinator is still connected
  limits @10 :Limits;
  curve @11 :Bool;           # the worker's socket takes CURVE-authenticated peers only
  device @12 :Text;          # the backend's device, "name, driver" (empty on the CPU)
  deviceMemoryBytes @13 :UInt64;
  profile @14 :Profile;
  # Started with --layers auto: while serving it takes another range (Assign from its
  # owner's session), answers `assigned`, drops its sequences and loads that range.
  movable @15 :Bool;
}

struct Plan {
  next @0 :Text;             # address of the next stage; empty: this is the last stage
  stageIndex @1 :UInt32;
  stageCount @2 :UInt32;
  # The last stage only: the first stage's address, where it may start chained steps
  # itself (see Forward.chainSteps). Empty: it never does.
  chainTo @3 :Text;
  # CURVE (Z85 public keys, empty on an open cluster): the server keys of `next` and
  # `chainTo`, and the peers this stage accepts for the session besides its own
  # authorized keys (the previous stage; on the first stage, the last one's chain).
  nextPublicKey @4 :Text;
  chainToPublicKey @5 :Text;
  acceptKeys @6 :List(Text);
  # The sender becomes the worker's owner even while another session's coordinator is
  # connected (that session's sequences are dropped; its messages then get `busy`).
  takeOver @7 :Bool;
}

struct SequenceRef {
  seqId @0 :Int32;
}

struct Truncate {
  seqId @0 :Int32;
  pos @1 :Int64;             # keep positions [0, pos)
}

# What one stage did with one batch, in that stage's own clock (steady nanoseconds;
# the coordinator maps them onto its clock with the offset it estimated at connect).
struct StageTiming {
  stage @0 :UInt32;          # index in the plan
  receivedNanos @1 :UInt64;  # the batch was taken from the socket
  idleSinceNanos @2 :UInt64; # the stage finished its previous work (waiting before this is queueing)
  computeStartNanos @3 :UInt64;
  computeEndNanos @4 :UInt64;
  sentNanos @5 :UInt64;      # output handed to the socket
}

# One stage's trace of the rows asked as traced: the RMS of each row's residual stream
# after each of the stage's layers.
struct LayerTrace {
  firstLayer @0 :UInt32;
  layers @1 :UInt32;
  seqIds @2 :List(Int32);    # the traced rows', in batch order
  positions @3 :List(Int32);
  rms @4 :List(Float32);     # rows x layers, row by row
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
  sentNanos @9 :UInt64;      # when the batch was sent to stage 0, in the sender's clock (the
                             # coordinator's; the last stage's for a chained step)
  timings @10 :List(StageTiming);  # one per stage already passed, appended by each
  logitsOutput @11 :List(LogitsOutput);  # one per row (only those with wantLogits matter),
                                         # passed on by each stage; empty: full for every row
  # A greedy chain: when every row wants its arg max only and none of those is in
  # stopTokens, the last stage itself sends step stepId + 1 to the first stage (the
  # same sequences, each row's arg max as its token, positions + 1, chainSteps - 1) before
  # it answers the coordinator, which saves the hops through the coordinator for each
  # token. Passed on by each stage; 0: the last stage answers only.
  chainSteps @12 :UInt32;
  stopTokens @13 :List(Int32);
  chained @14 :Bool;         # sent by the last stage: sentNanos is in its clock
  # One per row, or empty (none): > 0 makes every stage with recurrent (linear-attention)
  # layers checkpoint the row's sequence after it, keeping at most that many checkpoints
  # of it. Passed on by each stage; chained steps carry none.
  checkpointKeep @15 :List(UInt8);
  # One per row, or empty (none traced): each stage appends to layerTraces the RMS of the
  # traced rows' residual after each of its layers. Both passed on by each stage (the
  # last one's answer carries every stage's), chained steps keep the rows traced.
  trace @16 :List(Bool);
  layerTraces @17 :List(LayerTrace);
}

# The last stage's answer: one row per token whose wantLogits was set, in batch order,
# and one payload frame holding the full rows (those asked as `full`), fullRows x nVocab
# F32 values in row order (an empty frame when every row is an arg max).
struct Logits {
  stepId @0 :UInt64;
  seqIds @1 :List(Int32);
  positions @2 :List(Int32);
  rows @3 :UInt32;
  nVocab @4 :UInt32;
  sentNanos @5 :UInt64;      # copied from the forward
  timings @6 :List(StageTiming);  # every stage's, the last one's included
  # One per row, or empty when every row is full. -1: a full row (in the payload);
  # else the row was asked as `argmax`: the index of its largest logit (the first of
  # equal maxima), whose value is in argmaxLogits.
  argmaxIds @7 :List(Int32);
  argmaxLogits @8 :List(Float32);
  chained @9 :Bool;          # the last stage started step stepId + 1 itself (Forward.chainSteps)
  sentByLast @10 :Bool;      # the forward's `chained`: sentNanos is in the last stage's clock
  # The rows asked as `hidden`, in batch order (left out of seqIds, positions and rows):
  # their sequences, positions, and hidden states after the output norm (one row of
  # nEmbd values each, in `hidden`).
  hiddenSeqIds @11 :List(Int32);
  hiddenPositions @12 :List(Int32);
  nEmbd @13 :UInt32;
  hidden @14 :List(Float32);
  layerTraces @15 :List(LayerTrace);  # every stage's, in pipeline order (Forward.trace)
}

# The state of one sequence on one stage (the KV rows of each of its layers, as
# engine/state's SequenceState::snapshot writes them) travels as one payload frame.
# A snapshot answers snapshotRequest; restore carries one back (to the same stage or
# to a replica of its layers), and is answered with restored or an error.
struct SequenceSnapshot {
  seqId @0 :Int32;
  nPos @1 :Int64;            # positions held
  firstLayer @2 :UInt32;     # [firstLayer, lastLayer): the layers the bytes cover
  lastLayer @3 :UInt32;
  bytes @4 :UInt64;          # size of the payload frame
}

# pico-worker --layers auto holds no layer until the coordinator's placement assigns
# it a range: until then its Capabilities say firstLayer == lastLayer == 0 (and no
# limits), and it answers only hello, heartbeat, linkProbe and assign. It answers `assigned` (the
# same range) before it loads the range, then serves at the same address as a worker
# started with --layers.
struct Assign {
  firstLayer @0 :UInt32;     # [firstLayer, lastLayer)
  lastLayer @1 :UInt32;
}
# Placement asks a worker to measure its link to another worker: it connects to
# `address` (a CURVE client with its own keys and publicKey, when keyed) and times
# heartbeats there, empty and carrying probeBytes (at most 64 MiB), then answers
# linkMeasured (error set when the other worker did not answer within two seconds).
struct LinkProbe {
  address @0 :Text;
  publicKey @1 :Text;
  probeBytes @2 :UInt64;
}
struct LinkMeasured {
  address @0 :Text;
  latencySeconds @1 :Float64;   # one way: half the fastest empty round trip
  bytesPerSecond @2 :Float64;
  error @3 :Text;
}
# Slots on disk: slotSave writes a sequence's state on this stage's layers with its
# tokens to `name` in the worker's --slot-save-path, slotRestore reads it back into
# seqId (a file of another model or layer range is refused); both are answered by
# slotDone (restore: the file's tokens) or an error naming what is wrong.
struct SlotFile {
  seqId @0 :Int32;
  name @1 :Text;
  tokens @2 :List(Int32);    # save: the sequence's tokens (one per position); slotDone of a restore: the file's
  bytes @3 :UInt64;          # slotDone: the state's bytes written or read
}

struct Stats {
  memoryBytes @0 :UInt64;    # resident set of the process
  kvBytes @1 :UInt64;
  sequences @2 :UInt32;
  batches @3 :UInt64;
  tokens @4 :UInt64;
  chainedSteps @5 :UInt64;   # steps this (last) stage started itself (Forward.chainSteps)
  recurrentBytes @6 :UInt64; # of kvBytes: the recurrent states of a hybrid's linear layers, checkpoints included
  checkpointBytes @7 :UInt64; # of recurrentBytes: the checkpoints
  freeBytes @8 :UInt64;      # memory the process may still fill: its cgroup's room or MemAvailable, the less
}

struct Error {
  code @0 :ErrorCode;
  text @1 :Text;
  stepId @2 :UInt64;         # the forward step it concerns, 0: none
}

# A heartbeat answer carries the answerer's clock in sentNanos and the request's
# sentNanos in echoNanos: one NTP-style sample of the clock offset between the two.
# A heartbeat may carry one payload frame of probeBytes bytes (a bandwidth probe: the
# answer comes once all of it arrived; the receiver drops the bytes, and refuses a
# frame of another size). The answer echoes probeBytes with no payload.
struct Heartbeat {
  sentNanos @0 :UInt64;
  echoNanos @1 :UInt64;
  probeBytes @2 :UInt64;
}

struct Envelope {
  version @0 :UInt32;
  # The coordinator's session (a random id per pico-coord process), copied onto every
  # message of its steps, worker to worker too. A plan makes its session the worker's
  # owner; sequence messages (forward, close, truncate, snapshot, restore) of any other
  # session are refused with `busy`. Hello, heartbeat and stats are open to any peer.
  session @18 :UInt64;
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
    snapshotRequest @14 :SequenceRef;
    snapshot @15 :SequenceSnapshot;
    restore @16 :SequenceSnapshot;
    restored @17 :SequenceRef;
    assign @19 :Assign;
    assigned @20 :Assign;
    linkProbe @21 :LinkProbe;
    linkMeasured @22 :LinkMeasured;
    slotSave @23 :SlotFile;
    slotRestore @24 :SlotFile;
    slotDone @25 :SlotFile;
  }
}
