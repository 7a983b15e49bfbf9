// ThreadSanitizer suppressions for Debian's libgloo, linked into every
// binary that links gloo when built with --config=tsan (third_party/BUILD:
// the config's --define=sanitizer=tsan selects it). TSan reads them through
// __tsan_default_suppressions at start-up.
//
// Why, and why only this: libgloo is not built with -fsanitize=thread, so
// TSan sees its pthread calls (intercepted in libc) but not its atomics. When
// a peer dies mid-collective, our rank's waitRecv fails and the
// tcp::UnboundBuffer is destroyed on our thread while gloo's I/O thread has
// just broadcast on that buffer's condition variable (signalException). Gloo
// makes this safe by design (gloo/common/memory.h): the buffer's
// ShareableNonOwningPtr is its last member, so it is destroyed first, and
// its destructor spins until every NonOwningPtr the I/O thread took is
// released; only then are the condition variables destroyed. That
// hand-over is a shared_ptr reference count (atomics inside uninstrumented
// libgloo), invisible to TSan, which therefore reports the broadcast and
// the destruction as a race (the same hand-over shows as the buffer's
// delete against the I/O thread's handleRecvCompletion/handleSendCompletion
// taking the buffer's mutex, and as gloo's I/O thread's recv() into (or
// writev() from) a buffer's memory in tcp::Pair::read (Pair::write) against
// our freeing that memory after the buffer's destructor returned: an
// operation in progress holds the buffer through the hand-over, a queued one
// finds it gone and is dropped; since the gloo backend sends failure
// markers and peers die mid-exchange in the fault tests, the fingerprint
// exchange's vector, freed right after its buffer, shows it). It is not a
// lifetime bug of ours: no operation
// can touch the buffer, or the memory it points to, after its destructor
// returns. The patterns name only tcp::UnboundBuffer's destructor, the
// three methods gloo's I/O thread calls on a buffer through that hand-over,
// and the pair's read and write of a buffer it holds through it.
extern "C" const char* __tsan_default_suppressions() {
  return "race:gloo::transport::tcp::UnboundBuffer::~UnboundBuffer\n"
         "race:gloo::transport::tcp::UnboundBuffer::signalException\n"
         "race:gloo::transport::tcp::UnboundBuffer::handleRecvCompletion\n"
         "race:gloo::transport::tcp::UnboundBuffer::handleSendCompletion\n"
         "race:gloo::transport::tcp::Pair::read\n"
         "race:gloo::transport::tcp::Pair::write\n";
}
