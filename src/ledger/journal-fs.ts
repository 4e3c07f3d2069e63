import { open, rename, unlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';

/** An open journal segment, as the writer uses it. */
export interface JournalHandle {
  /** Writes at the end of the file; resolves to the bytes written, which may be fewer (a full disk). */
  write(buffer: Buffer, offset: number, length: number): Promise<number>;
  datasync(): Promise<void>;
  /** Cuts the file to `length` bytes (a torn write is taken back). */
  truncate(length: number): Promise<void>;
  close(): Promise<void>;
}

/**
 * The file operations of the journal's writer: a seam, so tests can make the disk full, writes
 * short or a seal fail without a real full disk (CI mounts nothing).
 */
export interface JournalFs {
  /** Opens (creating) a file for appending. */
  openAppend(path: string): Promise<JournalHandle>;
  /** Writes a file atomically, text or chunks of it: a temporary file, fsync, rename, fsync of its folder. */
  writeAtomic(path: string, text: string | Iterable<string>): Promise<void>;
  /** Does the disk take writes again? A small file written, fsynced and removed in `dir`. */
  probe(dir: string): Promise<void>;
}

/** The real file system (node:fs/promises). */
export const nodeJournalFs: JournalFs = {
  async openAppend(path) {
    const handle = await open(path, 'a');
    return {
      write: async (buffer, offset, length) => (await handle.write(buffer, offset, length, null)).bytesWritten,
      datasync: () => handle.datasync(),
      truncate: (length) => handle.truncate(length),
      close: () => handle.close(),
    };
  },

  async writeAtomic(path, text) {
    const tmp = `${path}.tmp`;
    if (typeof text === 'string') await writeFile(tmp, text);
    else {
      // A chunk at a time: the event loop runs between them.
      const handle = await open(tmp, 'w');
      try {
        for (const chunk of text) await handle.writeFile(chunk);
      } finally {
        await handle.close();
      }
    }
    await syncFile(tmp);
    await rename(tmp, path);
    await syncFile(dirname(path)); // the rename itself is durable only once the folder is
  },

  async probe(dir) {
    const path = join(dir, '.probe');
    await writeFile(path, Buffer.alloc(4096));
    await syncFile(path);
    await unlink(path);
  },
};

/** fsync of a file or a folder. */
export async function syncFile(path: string): Promise<void> {
  const handle = await open(path, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}
