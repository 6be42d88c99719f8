package io.regional.shim

import java.nio.charset.StandardCharsets
import java.nio.ByteBuffer
import java.nio.channels.FileChannel
import java.nio.file.{Files, Paths, StandardCopyOption, StandardOpenOption}
import java.util.UUID

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.SparkSession
import org.slf4j.LoggerFactory

/** Entry point for Python (`regional.register` calls `install`) and what the other parts share:
  * the version switch, the query -> checkpoint lookup, and writes into the regional store. */
object RegionalShim {
  val Version = "0.1.0"

  /** Spark lines this jar is compiled against. Spark 4.1 moved the streaming internals it touches
    * (`execution.streaming.runtime`, `.checkpointing`), so other versions are refused, not guessed. */
  val SupportedSparkLines: Seq[String] = Seq("4.2")

  val FileManagerConf = "spark.sql.streaming.checkpointFileManagerClass"
  /** Set in every session the shim is installed into: a Spark Connect client reads it to know the shim runs
    * (a server can name the extension in spark.sql.extensions and still lack the jar: Spark then only logs). */
  val InstalledConf = "regional.shim.installed"
  val StoreDir = "regional"

  private val log = LoggerFactory.getLogger("regional")
  private val sessions = java.util.Collections.newSetFromMap(
    new java.util.WeakHashMap[SparkSession, java.lang.Boolean]())  // Connect's sessions come and go
  @volatile private var listener: Option[(AnyRef, FailureListener)] = None // (SparkContext, listener)

  def supports(sparkVersion: String): Boolean =
    SupportedSparkLines.exists(line => sparkVersion == line || sparkVersion.startsWith(line + "."))

  def checkVersion(sparkVersion: String): Unit = if (!supports(sparkVersion)) {
    throw new UnsupportedOperationException(
      s"regional's JVM shim $Version supports Spark ${SupportedSparkLines.mkString(", ")}.x, and this is Spark " +
        s"$sparkVersion (Spark 4.1 moved the streaming internals the shim hooks). Install the pyspark version " +
        "regional pins, or drop the shim jar from spark.jars to run regional in pure Python")
  }

  /** Hooks the shim into a session: the failure listener, the recorder of writeStream's settings at query
    * start, and the offset-log keep-alive when no other checkpoint file manager is configured. Returns the file
    * manager class in effect. Called by `regional.register` through py4j, and by the extension's check rule for
    * every session (Spark Connect's sessions have no py4j); once per session. */
  def install(session: SparkSession): String = synchronized {
    checkVersion(org.apache.spark.SPARK_VERSION)
    if (sessions.add(session)) session.streams.addListener(new StartRecorder(new java.lang.ref.WeakReference(session)))
    session.conf.set(InstalledConf, Version)
    val sc = session.sparkContext
    if (!listener.exists(_._1 eq sc)) {
      val l = new FailureListener()
      sc.addSparkListener(l)
      listener = Some((sc, l))
      org.apache.spark.regional.RegionalUi.install(sc)  // the Spark UI's Regional tab, /metrics/regional
    }
    val ours = classOf[RegionalCheckpointFileManager].getName
    session.conf.getOption(FileManagerConf) match {
      case None => session.conf.set(FileManagerConf, ours); ours
      case Some(other) => other
    }
  }

  /** The resolved checkpoint root of a running query of an installed session. */
  def checkpointRoot(queryId: String): Option[String] = {
    val id = try UUID.fromString(queryId) catch { case _: IllegalArgumentException => return None }
    synchronized(sessions.asScala.toList).iterator.flatMap { s =>
      try {
        Option(s.streams.get(id)).map { wrapper =>
          // StreamingQueryWrapper.streamingQuery.resolvedCheckpointRoot: internal, hence reflection
          val execution = wrapper.getClass.getMethod("streamingQuery").invoke(wrapper)
          execution.getClass.getMethod("resolvedCheckpointRoot").invoke(execution).asInstanceOf[String]
        }
      } catch { case NonFatal(_) => None }
    }.nextOption()
  }

  /** `<checkpoint>/regional`, on whatever file system the checkpoint is (local, s3a, ...). */
  def storeDir(checkpointRoot: String): Option[Path] = Some(new Path(new Path(checkpointRoot), StoreDir))

  /** The Hadoop configuration of the running application (the session's `spark.hadoop.*`: s3a's endpoint,
    * keys, ...). */
  def hadoopConf(): Configuration =
    SparkSession.getActiveSession.orElse(SparkSession.getDefaultSession)
      .map(_.sparkContext.hadoopConfiguration).getOrElse(new Configuration())

  private def isLocal(p: Path): Boolean = {
    val scheme = p.toUri.getScheme
    scheme == null || scheme == "file"
  }

  private def localPath(p: Path): java.nio.file.Path = Paths.get(p.toUri.getPath)

  /** Whether the Python side has created the store (its query.json): the shim writes into existing stores only. */
  def storeExists(store: Path): Boolean =
    if (isLocal(store)) Files.exists(localPath(store).resolve("query.json"))
    else store.getFileSystem(hadoopConf()).exists(new Path(store, "query.json"))

  /** Writes `relative` under the store whole, in the store's file format (regional.store.files): a header line
    * `regional <kind> v<version> sha256=<hex of line 2>`, then the JSON. Locally a temporary file, fsync, rename
    * and fsync of the directory, as the Python side's; on an object store one PUT (S3A writes on close). */
  def writeStoreFile(store: Path, relative: String, kind: String, version: Int, content: String): Unit = {
    val body = content.getBytes(StandardCharsets.UTF_8)
    val header = s"regional $kind v$version sha256=${sha256Hex(body)}\n".getBytes(StandardCharsets.US_ASCII)
    val bytes = header ++ body ++ "\n".getBytes(StandardCharsets.US_ASCII)
    if (!isLocal(store)) {
      val target = new Path(store, relative)
      val out = target.getFileSystem(hadoopConf()).create(target, true)
      try out.write(bytes) finally out.close()
      return
    }
    val target = localPath(store).resolve(relative)
    Files.createDirectories(target.getParent)
    val tmp = target.getParent.resolve(s".${target.getFileName}.${UUID.randomUUID()}.tmp")
    val out = FileChannel.open(tmp, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)
    try {
      out.write(ByteBuffer.wrap(bytes))
      out.force(true)
    } finally out.close()
    Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING)
    val dir = FileChannel.open(target.getParent, StandardOpenOption.READ)
    try dir.force(true) finally dir.close()
  }

  def deleteStoreFile(store: Path, relative: String): Unit =
    if (isLocal(store)) Files.deleteIfExists(localPath(store).resolve(relative))
    else { val p = new Path(store, relative); p.getFileSystem(hadoopConf()).delete(p, false) }

  /** The bytes of a store file; None when it does not exist. */
  def readStoreBytes(store: Path, relative: String): Option[Array[Byte]] =
    if (isLocal(store)) {
      val p = localPath(store).resolve(relative)
      if (Files.exists(p)) Some(Files.readAllBytes(p)) else None
    } else {
      val p = new Path(store, relative)
      val fs = p.getFileSystem(hadoopConf())
      try {
        val in = fs.open(p)
        try Some(in.readAllBytes()) finally in.close()
      } catch { case _: java.io.FileNotFoundException => None }
    }

  /** The JSON line of a store file of `kind` and `version`; None when it is torn, damaged or of another format. */
  def readStoreFile(raw: Array[Byte], kind: String, version: Int): Option[String] = {
    val newline = raw.indexOf('\n'.toByte)
    if (newline < 0) return None
    val header = new String(raw.take(newline), StandardCharsets.US_ASCII).split(" ")
    val rest = raw.drop(newline + 1)
    val body = if (rest.nonEmpty && rest.last == '\n'.toByte) rest.dropRight(1) else rest
    val ok = header.length == 4 && header(0) == "regional" && header(1) == kind && header(2) == s"v$version" &&
      header(3) == s"sha256=${sha256Hex(body)}"
    if (ok) Some(new String(body, StandardCharsets.UTF_8)) else None
  }

  private def sha256Hex(bytes: Array[Byte]): String =
    java.security.MessageDigest.getInstance("SHA-256").digest(bytes).map(b => f"${b & 0xff}%02x").mkString

  def warn(message: String): Unit = log.warn(message)

  def json(fields: (String, Any)*): String = fields.map { case (k, v) => s"${quote(k)}: ${value(v)}" }
    .mkString("{", ", ", "}")

  private def value(v: Any): String = v match {
    case null | None => "null"
    case Some(x) => value(x)
    case b: Boolean => b.toString
    case n: Int => n.toString
    case n: Long => n.toString
    case d: Double => d.toString
    case m: Map[_, _] => m.toSeq.map { case (k, x) => s"${quote(k.toString)}: ${value(x)}" }.mkString("{", ", ", "}")
    case s => quote(s.toString)
  }

  private def quote(s: String): String = {
    val b = new StringBuilder("\"")
    s.foreach {
      case '"' => b.append("\\\"")
      case '\\' => b.append("\\\\")
      case '\n' => b.append("\\n")
      case '\r' => b.append("\\r")
      case '\t' => b.append("\\t")
      case c if c < ' ' => b.append(f"\\u${c.toInt}%04x")
      case c => b.append(c)
    }
    b.append('"').toString
  }
}
