package io.regional.shim


import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileStatus, FSDataInputStream, Path, PathFilter, UnsupportedFileSystemException}
import org.apache.spark.sql.execution.streaming.checkpointing.{CheckpointFileManager, FileContextBasedCheckpointFileManager, FileSystemBasedCheckpointFileManager}
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream

/** Spark's checkpoint file manager with one change: the offset-log purge skips `offsets/N` and `commits/N`
  * while a fallen-back region's ref_epoch is N (docs/design.md, guarantee 5). Spark's purge (on its own thread)
  * only deletes the entries between its previous threshold and the new one, so it never comes back for a
  * skipped entry: the file manager deletes it itself at the first purge after nothing references it. */
class RegionalCheckpointFileManager(path: Path, hadoopConf: Configuration) extends CheckpointFileManager {
  private val delegate: CheckpointFileManager =
    try new FileContextBasedCheckpointFileManager(path, hadoopConf)
    catch { case _: UnsupportedFileSystemException => new FileSystemBasedCheckpointFileManager(path, hadoopConf) }

  override def createAtomic(p: Path, overwriteIfPossible: Boolean): CancellableFSDataOutputStream =
    delegate.createAtomic(p, overwriteIfPossible)
  override def open(p: Path): FSDataInputStream = delegate.open(p)
  override def list(p: Path, filter: PathFilter): Array[FileStatus] = delegate.list(p, filter)
  override def mkdirs(p: Path): Unit = delegate.mkdirs(p)
  override def exists(p: Path): Boolean = delegate.exists(p)
  override def isLocal: Boolean = delegate.isLocal
  override def createCheckpointDirectory(): Path = delegate.createCheckpointDirectory()
  override def close(): Unit = delegate.close()

  override def delete(p: Path): Unit = {
    KeepAlive.referencedEpoch(p) match {
      case Some(epoch) => KeepAlive.keep(p, epoch)
      case None => delegate.delete(p)
    }
    KeepAlive.released(p).foreach(delegate.delete)
  }
}

object KeepAlive {
  /** Written by the Python store with every epoch record: the ref_epochs of fallen-back regions. */
  val ReferencedEpochsFile = "referenced-epochs"
  private val LogDirs = Set("offsets", "commits")

  /** `Some(N)` when `p` is `<checkpoint>/offsets/N` or `commits/N` and the regional store beside them
    * still references epoch N. Unreadable references keep the entry: deleting it cannot be undone. */
  def referencedEpoch(p: Path): Option[Long] = {
    val parent = p.getParent
    if (parent == null || !LogDirs.contains(parent.getName) || !p.getName.forall(_.isDigit) || p.getName.isEmpty) {
      return None
    }
    val epoch = try p.getName.toLong catch { case _: NumberFormatException => return None }
    val root = parent.getParent
    if (root == null) return None
    RegionalShim.storeDir(root.toString).flatMap { store =>
      val refs = new Path(store, ReferencedEpochsFile)
      try {
        RegionalShim.readStoreBytes(store, ReferencedEpochsFile) match {
          case None => None
          case Some(raw) =>
            // A JSON array of epoch numbers in the store's file format; unreadable keeps the entry.
            RegionalShim.readStoreFile(raw, ReferencedEpochsFile, 1) match {
              case Some(json) =>
                val epochs = json.trim.stripPrefix("[").stripSuffix("]").split(",").map(_.trim).filter(_.nonEmpty)
                  .map(_.toLong).toSet
                if (epochs.contains(epoch)) Some(epoch) else None
              case None =>
                RegionalShim.warn(s"regional: $refs is torn or of another format; keeping $p")
                Some(epoch)
            }
        }
      } catch {
        case NonFatal(e) =>
          RegionalShim.warn(s"regional: cannot read $refs ($e); keeping $p")
          Some(epoch)
      }
    }
  }

  // Entries kept from Spark's purge in this JVM, by log directory. After a restart Spark's first purge
  // lists the whole directory, so entries kept by an earlier run are seen again then.
  private val kept = scala.collection.mutable.Map[Path, Set[Path]]()

  def keep(p: Path, epoch: Long): Unit = {
    val added = kept.synchronized {
      val before = kept.getOrElse(p.getParent, Set.empty)
      kept(p.getParent) = before + p
      !before.contains(p)
    }
    if (added) RegionalShim.warn(s"regional: kept $p: a fallen-back region still references epoch $epoch")
  }

  /** Entries kept earlier in the directory of `p` that nothing references any more: to delete now. */
  def released(p: Path): Seq[Path] = kept.synchronized {
    val dir = p.getParent
    val (stillReferenced, free) = kept.getOrElse(dir, Set.empty).partition(k => referencedEpoch(k).isDefined)
    if (stillReferenced.isEmpty) kept.remove(dir) else kept(dir) = stillReferenced
    free.toSeq
  }
}
