import { nodeJournalFs, type JournalFs, type JournalHandle } from '../../src/ledger/journal-fs.js';

function enospc(): NodeJS.ErrnoException {
  const err = new Error('ENOSPC: no space left on device, write') as NodeJS.ErrnoException;
  err.code = 'ENOSPC';
  return err;
}

/**
 * The real file system with faults on demand, for the ledger's writer: a full disk, short
 * writes, a seal that fails. Counts what it was asked to do.
 */
export class FaultyFs implements JournalFs {
  /** Every write, probe and atomic write fails with ENOSPC. */
  full = false;
  /** The next write writes at most this many bytes (then `full` decides what the one after does). */
  shortNext: number | null = null;
  /** Atomic writes (a seal's index and snapshot) fail. */
  failAtomic = false;
  /** While `full`, syncs and the probe write work (a disk with a few KB free): only the journal's writes fail. */
  probeFits = false;
  writes = 0;
  shortWrites = 0;

  openAppend = async (path: string): Promise<JournalHandle> => {
    const real = await nodeJournalFs.openAppend(path);
    return {
      write: async (buffer, offset, length) => {
        this.writes++;
        if (this.shortNext !== null) {
          const n = Math.min(length, this.shortNext);
          this.shortNext = null;
          this.shortWrites++;
          return real.write(buffer, offset, n);
        }
        if (this.full) throw enospc();
        return real.write(buffer, offset, length);
      },
      datasync: () => (this.full && !this.probeFits ? Promise.reject(enospc()) : real.datasync()),
      truncate: (length) => real.truncate(length), // freeing space works on a full disk
      close: () => real.close(),
    };
  };

  writeAtomic = async (path: string, text: string | Iterable<string>): Promise<void> => {
    if (this.full || this.failAtomic) throw enospc();
    return nodeJournalFs.writeAtomic(path, text);
  };

  probe = async (dir: string): Promise<void> => {
    if ((this.full && !this.probeFits) || this.failAtomic) throw enospc();
    return nodeJournalFs.probe(dir);
  };
}
