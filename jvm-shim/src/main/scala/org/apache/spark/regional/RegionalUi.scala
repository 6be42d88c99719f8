package org.apache.spark.regional

import java.net.URLEncoder
import java.nio.charset.StandardCharsets
import java.util.Base64

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal
import scala.xml.Node

import com.fasterxml.jackson.databind.JsonNode
import jakarta.servlet.http.HttpServletRequest

import org.apache.spark.{SparkContext, SparkEnv}
import org.apache.spark.ui.{JettyUtils, SparkUI, SparkUITab, UIUtils, WebUIPage}

import io.regional.shim.RegionalShim

/** The "Regional" tab of the driver's Spark UI and `/metrics/regional` (the same figures as the metrics
  * system's, in Prometheus' text format with `query` and `region` labels). Everything is read from the queries'
  * status snapshots when a page is asked for: nothing here runs in an epoch. Text from the outside world (region
  * ids, reasons, query names) goes into the page as XML text or attribute values, which scala.xml escapes. */
object RegionalUi {
  val EnabledConf = "spark.regional.ui.enabled"
  val MetricsPath = "/metrics/regional"
  private val installed = java.util.Collections.newSetFromMap(
    new java.util.WeakHashMap[SparkContext, java.lang.Boolean]())

  def install(sc: SparkContext): Unit = synchronized {
    if (installed.contains(sc) || !sc.getConf.getBoolean(EnabledConf, true)) return
    installed.add(sc)
    try sc.ui.foreach { ui =>
      ui.attachTab(new RegionalTab(ui))
      attachText(ui, sc, MetricsPath, _ => PrometheusText.render())
    } catch { case NonFatal(e) => RegionalShim.warn(s"regional: could not add the Regional tab to the Spark UI: $e") }
  }
}

/** `JettyUtils.createServletHandler` and `SparkUI.attachHandler`, reflectively: their signatures name Jetty's
  * classes as Spark compiled against them, and pyspark's jar holds them shaded (`org.sparkproject.jetty`). */
private object attachText {
  def apply(ui: SparkUI, sc: SparkContext, path: String, respond: HttpServletRequest => String): Unit = {
    val params = JettyUtils.textResponderToServlet(respond)
    val create = JettyUtils.getClass.getMethods.find(m => m.getName == "createServletHandler" &&
      m.getParameterCount == 4 && m.getParameterTypes()(1).isAssignableFrom(params.getClass))
      .getOrElse(throw new IllegalStateException("this Spark has no JettyUtils.createServletHandler(path, params, conf, base)"))
    val handler = create.invoke(JettyUtils, path, params, sc.getConf, "")
    val attach = ui.getClass.getMethods.find(m => m.getName == "attachHandler" && m.getParameterCount == 1 &&
      m.getParameterTypes()(0).isInstance(handler))
      .getOrElse(throw new IllegalStateException("this Spark's UI has no attachHandler(handler)"))
    attach.invoke(ui, handler)
  }
}

class RegionalTab(parent: SparkUI) extends SparkUITab(parent, "regional") {
  override val name = "Regional"
  attachPage(new RegionalPage(this))
}

class RegionalPage(tab: RegionalTab) extends WebUIPage("") {
  import RegionalPage._

  override def render(request: HttpServletRequest): Seq[Node] = {
    val content = Option(request.getParameter("id")).flatMap(RegionalBoard.view) match {
      case Some(view) => queryPage(request, view)
      case None => listPage(request)
    }
    UIUtils.headerSparkPage(request, "Regional", content, tab)
  }

  private def link(request: HttpServletRequest, params: (String, String)*): String =
    UIUtils.prependBaseUri(request, "/regional/") + params.map { case (k, v) =>
      s"$k=${URLEncoder.encode(v, StandardCharsets.UTF_8)}" }.mkString("?", "&", "")

  private def listPage(request: HttpServletRequest): Seq[Node] = {
    val views = RegionalBoard.views
    if (views.isEmpty) <p>No regional query has started in this application.</p>
    else <table class="table table-bordered table-sm table-striped" id="regional-queries">
      <thead><tr><th>Query</th><th>Id</th><th>State</th><th>Epoch</th><th>Regions</th><th>Fallen back</th>
        <th>Oldest ref_epoch age</th><th>Dead letters</th><th>Lag</th></tr></thead>
      <tbody>{views.map { v =>
        val s = RegionalBoard.snapshot(v)
        def f(key: String): String = s.flatMap(RegionalBoard.figure(_, key)).map(number).getOrElse("-")
        <tr>
          <td><a href={link(request, "id" -> v.id)}>{v.label}</a></td><td>{v.id}</td>
          <td>{v.ended.getOrElse("active")}</td><td>{f("epoch")}</td><td>{f("regions")}</td>
          <td class="regional-fallen-back">{f("fallen_back")}</td>
          <td>{f("oldest_ref_age_epochs")} epochs / {f("oldest_ref_age_seconds")} s</td>
          <td>{f("dead_letters")}</td><td>{f("lag")}</td>
        </tr>
      }}</tbody>
    </table>
  }

  private def queryPage(request: HttpServletRequest, view: QueryView): Seq[Node] = {
    val snapshot = RegionalBoard.snapshot(view)
    val summary =
      <div id="regional-summary">
        <p><a href={link(request)}>All regional queries</a></p>
        <h4>{view.label}</h4>
        <ul class="list-unstyled">
          <li><strong>Id:</strong> {view.id} <strong>Run:</strong> {view.runId}</li>
          <li><strong>State:</strong> {view.ended.getOrElse("active")}</li>
          <li><strong>Store:</strong> {view.store.toString}</li>
          {view.readError.toSeq.map(e => <li class="text-danger"><strong>Status unreadable:</strong> {e}</li>)}
        </ul>
      </div>
    snapshot match {
      case None => summary ++ <p>No epoch recorded yet.</p>
      case Some(s) => summary ++ figures(s) ++ regionsTable(request, view, s) ++ epochsTable(s) ++ timeline(s)
    }
  }

  private def figures(s: JsonNode): Seq[Node] = {
    def f(key: String): String = RegionalBoard.figure(s, key).map(number).getOrElse("-")
    <p id="regional-figures">
      Epoch {f("epoch")} ({s.path("metrics").path("kind").asText("-")}), {f("regions")} regions,
      {f("fallen_back")} fallen back, {f("quarantined")} quarantined, oldest ref_epoch age
      {f("oldest_ref_age_epochs")} epochs / {f("oldest_ref_age_seconds")} s, {f("dead_letters")} dead letters,
      total lag {f("lag")}{if (f("backoff_seconds") != "0") s", backing off ${f("backoff_seconds")} s" else ""}.
      Snapshot taken {UIUtils.formatDate((s.path("taken_at").asDouble(0.0) * 1000).toLong)}.
    </p>
  }

  private def regionsTable(request: HttpServletRequest, view: QueryView, s: JsonNode): Seq[Node] = {
    val rows = s.path("regions").properties().asScala.toSeq.map(e => e.getKey -> e.getValue)
    val sort = Option(request.getParameter("sort")).filter(Columns.map(_._1).contains).getOrElse("lag")
    val desc = Option(request.getParameter("desc")).forall(_ != "0")
    val size = Option(request.getParameter("size")).flatMap(_.toIntOption).getOrElse(100).max(1).min(1000)
    val pages = ((rows.size + size - 1) / size).max(1)
    val page = Option(request.getParameter("page")).flatMap(_.toIntOption).getOrElse(1).max(1).min(pages)
    val sorted = sortRows(rows, sort, desc)
    val shown = sorted.slice((page - 1) * size, page * size)
    def at(p: Int, column: String = sort, descending: Boolean = desc): String = link(request, "id" -> view.id,
      "sort" -> column, "desc" -> (if (descending) "1" else "0"), "size" -> size.toString, "page" -> p.toString)
    val pager = <p class="regional-pager">Regions {(page - 1) * size + 1}-{(page - 1) * size + shown.size} of
      {rows.size} (page {page} of {pages})
      {if (page > 1) <a href={at(page - 1)}>previous</a> else ""}
      {if (page < pages) <a href={at(page + 1)}>next</a> else ""}</p>;
    <h4>Regions</h4> ++ pager ++ <table class="table table-bordered table-sm table-striped" id="regional-regions">
      <thead><tr>{Columns.map { case (key, title) =>
        <th><a href={at(1, key, if (key == sort) !desc else true)}>{
          if (key == sort) s"$title ${if (desc) "▾" else "▴"}" else title}</a></th>
      }}</tr></thead>
      <tbody>{shown.map { case (id, r) =>
        <tr class={s"regional-region regional-${r.path("state").asText("")}"}>
          <td class="regional-region-id">{id}</td>
          <td class="regional-state">{r.path("state").asText("")}</td>
          <td>{text(r, "committed_offset")}</td><td>{text(r, "latest_offset")}</td><td>{text(r, "lag")}</td>
          <td class="regional-ref-epoch">{text(r, "ref_epoch")}</td>
          <td>{if (r.path("ref_age_epochs").isNull) "-" else s"${text(r, "ref_age_epochs")} epochs / ${
            text(r, "ref_age_seconds")} s"}</td>
          <td>{text(r, "consecutive_failures")}</td><td>{text(r, "dead_letters")}</td>
          <td>{text(r, "retention_headroom")}</td>
          <td>{if (r.path("timed_range").isNull) "-" else s"${text(r, "timed_range")} offsets"}</td>
          <td class="regional-reason">{reason(r)}</td>
        </tr>
      }}</tbody>
    </table>
  }

  private def epochsTable(s: JsonNode): Seq[Node] = {
    val epochs = s.path("epochs").elements().asScala.toSeq.reverse
    <h4>Last epochs</h4> ++ <table class="table table-bordered table-sm table-striped" id="regional-epochs">
      <thead><tr><th>Epoch</th><th>Kind</th><th>Recorded</th><th>Committed regions</th><th>Rows</th>
        <th>Fallen back</th><th>Dead-lettered</th></tr></thead>
      <tbody>{epochs.map { e =>
        <tr>
          <td>{text(e, "epoch")}</td><td>{e.path("kind").asText("")}{
            if (e.path("reason").isTextual) s" (${e.path("reason").asText()})" else ""}</td>
          <td>{UIUtils.formatDate((e.path("recorded_at").asDouble(0.0) * 1000).toLong)}</td>
          <td>{text(e, "committed")}</td><td>{text(e, "rows")}</td>
          <td>{text(e, "fallen_back")}{regionList(e.path("fallen_back_regions"))}</td>
          <td>{text(e, "dead_lettered")}{regionList(e.path("dead_lettered_regions"))}</td>
        </tr>
      }}</tbody>
    </table>
  }

  private def regionList(node: JsonNode): Seq[Node] = {
    val items = node.properties().asScala.toSeq
    if (items.isEmpty) Nil
    else <ul>{items.map(e => <li><code>{e.getKey}</code>: {e.getValue.asText("")}</li>)}</ul>
  }

  private def timeline(s: JsonNode): Seq[Node] = {
    val svg = s.path("timeline_svg").asText("")
    if (svg.isEmpty) Nil
    else {
      // An <img> of a data URI: an SVG shown this way runs no script, whatever its text holds.
      val uri = "data:image/svg+xml;base64," + Base64.getEncoder.encodeToString(svg.getBytes(StandardCharsets.UTF_8))
      <h4>Timeline</h4> ++ <img id="regional-timeline" alt="regions by epochs, coloured by outcome" src={uri}/>
    }
  }
}

object RegionalPage {
  val Columns: Seq[(String, String)] = Seq(
    "region" -> "Region", "state" -> "State", "committed_offset" -> "Committed", "latest_offset" -> "Latest",
    "lag" -> "Lag", "ref_epoch" -> "ref_epoch", "ref_age_seconds" -> "ref_epoch age",
    "consecutive_failures" -> "Failures", "dead_letters" -> "Dead letters",
    "retention_headroom" -> "Retention headroom", "timed_range" -> "Range limit", "reason" -> "Last reason")

  def number(d: Double): String = if (d == d.floor && d.abs < 1e15) d.toLong.toString else f"$d%.1f"

  def text(node: JsonNode, key: String): String = {
    val v = node.path(key)
    if (v.isNull || v.isMissingNode) "-" else v.asText()
  }

  def reason(r: JsonNode): String = {
    val why = if (r.path("reason").isTextual) r.path("reason").asText() else ""
    val isolating = r.path("isolating")
    val shown =
      if (isolating.isArray && isolating.size() == 2)
        s"isolating offsets [${isolating.get(0).asLong()}, ${isolating.get(1).asLong()}) $why".trim
      else why
    // issue 55: every suspect is resolved within suspectTimeout; the page says by when and what happens then
    val bound = r.path("resolved_by")
    if (bound.path("at").isNumber) {
      val at = java.time.Instant.ofEpochMilli((bound.path("at").asDouble() * 1000).toLong)
        .truncatedTo(java.time.temporal.ChronoUnit.SECONDS)
      s"$shown (resolved by $at at the latest: dead-lettered once proven poison, else " +
        s"${bound.path("unproven_then").asText("")})"
    } else shown
  }

  def sortRows(rows: Seq[(String, JsonNode)], key: String, desc: Boolean): Seq[(String, JsonNode)] = {
    val ordered = key match {
      case "region" => rows.sortBy(_._1)
      case "state" | "reason" => rows.sortBy { case (id, r) => (r.path(key).asText(""), id) }
      case _ => rows.sortBy { case (id, r) =>
        val v = r.path(key); (if (v.isNumber) v.asDouble() else Double.NegativeInfinity, id) }
    }
    if (desc) ordered.reverse else ordered
  }
}

/** `/metrics/regional`: every query's figures and its top regions' (the metrics system's set), with labels. */
object PrometheusText {
  import RegionalMetrics._

  def render(): String = {
    val b = new StringBuilder
    val views = RegionalBoard.views.map(v => v -> RegionalBoard.snapshot(v))
    def family(name: String, help: String)(samples: Seq[(String, Double)]): Unit = {
      val kind = if (name.endsWith("_total")) "counter" else "gauge"  // what only grows (text format 0.0.4)
      b.append(s"# HELP regional_$name $help\n# TYPE regional_$name $kind\n")
      samples.foreach { case (labels, value) => b.append(s"regional_$name{$labels} ${format(value)}\n") }
    }
    def query(v: QueryView): String = s"""query="${escape(v.label)}",query_id="${escape(v.id)}""""
    QueryFigures.foreach { case (name, key, help) =>
      family(name, help)(views.flatMap { case (v, s) => s.flatMap(RegionalBoard.figure(_, key)).map(query(v) -> _) })
    }
    family("active", "1 while the query runs, 0 once it stopped or failed")(
      views.map { case (v, _) => query(v) -> (if (v.active) 1.0 else 0.0) })
    family("status_age_seconds", "seconds since the figures were taken (they stop moving when the query stops)")(
      views.flatMap { case (v, s) => s.map(n => query(v) -> RegionalBoard.age(n)) })
    val limit = Option(SparkEnv.get).map(regionsLimit).getOrElse(DefaultRegions)
    val top = views.map { case (v, s) => v -> s.toSeq.flatMap(topRegions(_, limit)) }  // sorted once per query
    RegionFigures.foreach { case (name, key, help) =>
      family(s"region_$name", help)(top.flatMap { case (v, regions) =>
        regions.map { case (id, row) => s"""${query(v)},region="${escape(id)}"""" -> regionValue(row, key) }
      })
    }
    b.toString
  }

  private def format(d: Double): String =
    if (d.isNaN) "NaN" else if (d == d.floor && d.abs < 1e15) d.toLong.toString else d.toString

  /** A label value in the text format: backslash, double quote and newline escaped. */
  def escape(s: String): String = s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")
}
